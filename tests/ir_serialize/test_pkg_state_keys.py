"""Manifest schema (§3), signing and key files (§4, §10, §13); the state is in test_pkg_state.py."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cuvil_edge.errors import (
    BadNameError,
    KeyFileError,
    PackageFormatError,
    UnsupportedFormatError,
)
from cuvil_edge.ir_serialize import (
    Manifest,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    save_private_key,
    save_public_key,
)
from cuvil_edge.ir_serialize.dsse import sign_envelope
from cuvil_edge.ir_serialize.manifest import MANIFEST_TYPE, Region, ReleaseStatement, Sealed
from cuvil_edge.ir_serialize.signing import pae

DIGEST = hashlib.sha256(b"payload").hexdigest()


# --- manifest and release statement ---------------------------------------------------
def _manifest(**over):
    region = Region("header", "", 0, 64, DIGEST)
    fields = dict(package="model", site="s", target="t", version=2, issued_at=10, expires=20, nonce=None,
                  release_sha256=DIGEST, payload_length=64, sealed=None, regions=(region,))
    fields.update(over)
    return Manifest(**fields)


def test_manifest_and_release_round_trip_through_bytes():
    m = _manifest(nonce="abc", sealed=Sealed(DIGEST, 200))
    assert Manifest.from_bytes(m.to_bytes()) == m
    assert m.to_bytes() == json.dumps(m.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    r = ReleaseStatement("model", 7, ("a", "b"), m.regions)
    assert ReleaseStatement.from_bytes(r.to_bytes()) == r


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda d: d.update(extra=1), UnsupportedFormatError),
        (lambda d: d.pop("expires"), PackageFormatError),
        (lambda d: d.update(version=True), PackageFormatError),
        (lambda d: d.update(version=1.0), PackageFormatError),
        (lambda d: d.update(version=-1), PackageFormatError),
        (lambda d: d.update(site=""), PackageFormatError),
        (lambda d: d.update(site="a/b"), BadNameError),
        (lambda d: d.update(release_sha256=DIGEST.upper()), PackageFormatError),
        (lambda d: d.update(format=1), UnsupportedFormatError),
        (lambda d: d.update(expires=5), PackageFormatError),
        (lambda d: d["regions"][0].update(kind="blob"), UnsupportedFormatError),
    ],
    ids=["unknown-field", "missing-field", "bool", "float", "negative", "empty-site", "slash-site", "upper-hex",
         "format", "window", "region-kind"],
)
def test_manifest_from_bytes_rejects(change, error):
    doc = _manifest().to_dict()
    change(doc)
    with pytest.raises(error):
        Manifest.from_bytes(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def test_manifest_from_bytes_rejects_non_canonical():
    with pytest.raises(PackageFormatError, match="canonical"):
        Manifest.from_bytes(json.dumps(_manifest().to_dict(), indent=1).encode())


# --- signing --------------------------------------------------------------------------
def test_pae_matches_dsse_spec_example():
    # Example from the DSSE v1 protocol document.
    assert pae("http://example.com/HelloWorld", b"hello world") == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_signature_covers_payload_type_and_exact_bytes():
    private, public = generate_keypair()
    body = _manifest().to_bytes()
    [(_, sig)] = sign_envelope(MANIFEST_TYPE, body, [private]).signatures
    assert public.verify(sig, pae(MANIFEST_TYPE, body)) is None
    with pytest.raises(InvalidSignature):  # the same bytes under another payload type
        public.verify(sig, pae(MANIFEST_TYPE + "x", body))


# --- key files -----------------------------------------------------------------------
def test_private_key_file_round_trip_and_mode(tmp_path):
    private, public = generate_keypair()
    path = tmp_path / "coordinator.key"
    save_private_key(private, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert key_id(load_private_key(path).public_key()) == key_id(public)


def test_public_key_file_is_one_hex_line(tmp_path):
    _, public = generate_keypair()
    path = tmp_path / "coordinator.pub"
    save_public_key(public, path)
    text = path.read_text()
    assert len(text) == 65 and text.endswith("\n")
    assert key_id(load_public_key(path)) == key_id(public)


@pytest.mark.parametrize("loader", [load_private_key, load_public_key])
def test_missing_key_file_names_path(tmp_path, loader):
    with pytest.raises(KeyFileError, match="absent.key"):
        loader(tmp_path / "absent.key")


def test_garbage_public_key_file_rejected(tmp_path):
    path = tmp_path / "bad.pub"
    path.write_text("not a key\n")
    with pytest.raises(KeyFileError, match="bad.pub"):
        load_public_key(path)


def test_non_ed25519_private_key_rejected(tmp_path):
    path = tmp_path / "x25519.key"
    pem = X25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption())
    path.write_bytes(pem)
    with pytest.raises(KeyFileError, match="not an Ed25519"):
        load_private_key(path)


def test_garbage_private_key_file_rejected(tmp_path):
    path = tmp_path / "bad.key"
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(KeyFileError, match="bad.key"):
        load_private_key(path)
