"""Anti-rollback state (PACKAGE_SPEC §9), manifest schema (§3), signing and key files (§4, §10)."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cuvil_edge.errors import KeyFileError, PackageFormatError, RollbackError, StateError
from cuvil_edge.ir_serialize import (AntiRollbackState, Manifest, generate_keypair, key_id, load_private_key,
                                     load_public_key, save_private_key, save_public_key)
from cuvil_edge.ir_serialize.signing import pae, sign_manifest, verify_manifest_signature

DIGEST = hashlib.sha256(b"payload").hexdigest()


# --- state --------------------------------------------------------------------------
def test_state_starts_empty(tmp_path):
    assert AntiRollbackState(tmp_path / "state").last_version("site-a") is None


def test_state_survives_reopen(tmp_path):
    AntiRollbackState(tmp_path).accept("site-a", 3, DIGEST)
    reopened = AntiRollbackState(tmp_path)
    assert reopened.last_version("site-a") == 3
    assert reopened.last_accepted("site-a").digest == DIGEST
    assert reopened.last_version("site-b") is None


def test_state_file_is_private_and_no_temp_file_left(tmp_path):
    state = AntiRollbackState(tmp_path / "s")
    state.accept("site-a", 1, DIGEST)
    state.accept("site-a", 2, DIGEST)
    assert stat.S_IMODE(os.stat(state.path).st_mode) == 0o600
    assert os.listdir(tmp_path / "s") == ["anti_rollback.json"]


def test_state_refuses_older_or_same_version(tmp_path):
    state = AntiRollbackState(tmp_path)
    state.accept("site-a", 3, DIGEST)
    for version in (2, 3):
        with pytest.raises(RollbackError):
            state.accept("site-a", version, DIGEST)
    assert state.last_version("site-a") == 3


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'{"format":1,"sites":{"a":{"version":1}}}', b'{"format":1,"format":1,"sites":{}}',
     b'{"format":1,"sites":{"a":{"version":true,"digest":"' + DIGEST.encode() + b'"}}}', b'{"format":2,"sites":{}}',
     b'{"format":1,"sites":{},"extra":0}', b"\xff\xfe"],
    ids=["empty", "garbage", "missing-digest", "duplicate-key", "bool-version", "future-format", "unknown-field",
         "bad-utf8"],
)
def test_corrupt_state_file_raises_state_error(tmp_path, content):
    (tmp_path / "anti_rollback.json").write_bytes(content)
    state = AntiRollbackState(tmp_path)
    with pytest.raises(StateError, match="never reset"):
        state.last_version("a")
    with pytest.raises(StateError):
        state.accept("a", 9, DIGEST)
    assert (tmp_path / "anti_rollback.json").read_bytes() == content  # not silently reset


def test_state_rejects_bad_digest(tmp_path):
    with pytest.raises(StateError, match="hex"):
        AntiRollbackState(tmp_path).accept("a", 1, "xyz")


# --- manifest -----------------------------------------------------------------------
def _manifest(**over):
    fields = dict(site="s", target="t", version=2, issued_at=10, expires=20, payload_sha256=DIGEST, payload_length=5)
    fields.update(over)
    return Manifest(**fields)


def test_manifest_round_trips_through_dict_and_bytes():
    m = _manifest()
    assert Manifest.from_dict(m.to_dict()) == m
    assert Manifest.from_bytes(m.to_bytes()) == m
    assert m.to_bytes() == json.dumps(m.to_dict(), sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(extra=1), "unknown"),
        (lambda d: d.pop("expires"), "lacks"),
        (lambda d: d.update(version=True), "integer"),
        (lambda d: d.update(version=1.0), "integer"),
        (lambda d: d.update(version=-1), "outside"),
        (lambda d: d.update(site=""), "empty"),
        (lambda d: d.update(payload_sha256=DIGEST.upper()), "hex"),
        (lambda d: d.update(format=2), "not supported"),
        (lambda d: d.update(expires=5), "not after"),
    ],
    ids=["unknown-field", "missing-field", "bool", "float", "negative", "empty-site", "upper-hex", "format", "window"],
)
def test_manifest_from_dict_rejects(change, message):
    doc = _manifest().to_dict()
    change(doc)
    with pytest.raises(PackageFormatError, match=message):
        Manifest.from_dict(doc)


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
    sig = sign_manifest(body, private)
    verify_manifest_signature(body, sig, public)
    assert public.verify(sig, pae("application/vnd.cuvil.manifest+json", body)) is None


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
