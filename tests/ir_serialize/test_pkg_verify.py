"""Signed package verification: round trip and one named test per attack (PACKAGE_SPEC §7)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap

import numpy as np
import pytest
from conftest import (EXPIRES, ISSUED, LIMIT, SITE, TARGET, flip, mutate_header, sign_package,
                      verify_kwargs)

from cuvil_edge.errors import (ExpiredPackageError, PackageError, PackageFormatError, PackageSizeError,
                               PayloadDigestError, RollbackError, SignatureError, WrongSiteError, WrongTargetError)
from cuvil_edge.ir_serialize import Manifest, generate_keypair, open_package, verify_package, write_package
from cuvil_edge.ir_serialize.container import ALIGN, encode_payload
from cuvil_edge.ir_serialize.package import MAX_MANIFEST_BYTES, PRELUDE


def _manifest_span(pkg: bytes) -> tuple[int, int]:
    _, _, m_len, _ = PRELUDE.unpack_from(pkg, 0)
    return PRELUDE.size, PRELUDE.size + m_len


def _manifest_for(payload: bytes, **over) -> Manifest:
    fields = dict(site=SITE, target=TARGET, version=5, issued_at=ISSUED, expires=EXPIRES,
                  payload_sha256=hashlib.sha256(payload).hexdigest(), payload_length=len(payload))
    fields.update(over)
    return Manifest(**fields)


def _resigned(graph, keys, **over) -> bytes:
    """A validly signed package whose manifest has fields ``over``."""
    payload = encode_payload(graph)
    return sign_package(_manifest_for(payload, **over).to_bytes(), payload, keys[0])


# --- round trip -----------------------------------------------------------------
def test_round_trip(graph, keys, package):
    verified = verify_package(package, **verify_kwargs(keys))
    assert verified.graph.to_dict() == graph.to_dict()
    for name, array in graph.initializers.items():
        np.testing.assert_array_equal(verified.graph.initializers[name], array)
        assert np.shares_memory(verified.graph.initializers[name], np.frombuffer(package, dtype=np.uint8))
    assert verified.manifest.site == SITE and verified.manifest.version == 5
    assert verified.size == len(package)
    assert len(package) % ALIGN == 0


def test_first_package_accepted_without_previous_version(keys, package):
    assert verify_package(package, **verify_kwargs(keys, last_version=None)).manifest.version == 5


def test_open_package_maps_file_without_copying(tmp_path, graph, keys, package):
    path = tmp_path / "model.cpk"
    path.write_bytes(package)
    verified = open_package(path, **verify_kwargs(keys))
    array = verified.graph.initializers["w1"]
    base = array
    while not isinstance(base, memoryview):
        base = base.base
    assert isinstance(base.obj, mmap.mmap)
    np.testing.assert_array_equal(array, graph.initializers["w1"])


def test_open_package_rejects_oversize_file_before_mapping(tmp_path, keys, package):
    path = tmp_path / "big.cpk"
    path.write_bytes(package)
    with pytest.raises(PackageSizeError, match="limit"):
        open_package(path, **verify_kwargs(keys, max_package_bytes=len(package) - 1))


def test_open_package_missing_file(tmp_path, keys):
    with pytest.raises(PackageError, match="nope.cpk"):
        open_package(tmp_path / "nope.cpk", **verify_kwargs(keys))


# --- attacks: one named test each -------------------------------------------------
def test_tampered_manifest_byte_rejected(keys, package):
    start, _ = _manifest_span(package)
    with pytest.raises(SignatureError):
        verify_package(flip(package, start + 10), **verify_kwargs(keys))


def test_tampered_signature_rejected(keys, package):
    _, end = _manifest_span(package)
    with pytest.raises(SignatureError):
        verify_package(flip(package, end + 3), **verify_kwargs(keys))


def test_tampered_payload_byte_rejected(keys, package):
    with pytest.raises(PayloadDigestError, match="sha256"):
        verify_package(flip(package, len(package) - ALIGN), **verify_kwargs(keys))


def test_untrusted_key_rejected(keys, package):
    _, other_public = generate_keypair()
    with pytest.raises(SignatureError, match="pinned"):
        verify_package(package, **verify_kwargs(keys, public_key=other_public))


def test_package_for_other_site_rejected(keys, package):
    with pytest.raises(WrongSiteError, match="site-a"):
        verify_package(package, **verify_kwargs(keys, site="site-b"))


def test_package_for_other_target_rejected(keys, package):
    with pytest.raises(WrongTargetError, match="cpu-x86"):
        verify_package(package, **verify_kwargs(keys, target="npu"))


def test_expired_package_rejected(keys, package):
    with pytest.raises(ExpiredPackageError, match="expired"):
        verify_package(package, **verify_kwargs(keys, now=EXPIRES))


def test_not_yet_valid_package_rejected(keys, package):
    with pytest.raises(ExpiredPackageError, match="future"):
        verify_package(package, **verify_kwargs(keys, now=ISSUED - 301))


def test_small_clock_skew_tolerated(keys, package):
    assert verify_package(package, **verify_kwargs(keys, now=ISSUED - 299)).manifest.version == 5


def test_older_version_rejected(keys, package):
    with pytest.raises(RollbackError, match="not newer"):
        verify_package(package, **verify_kwargs(keys, last_version=6))


def test_same_version_rejected(keys, package):
    with pytest.raises(RollbackError, match="not newer"):
        verify_package(package, **verify_kwargs(keys, last_version=5))


def test_truncated_envelope_rejected(keys, package):
    _, end = _manifest_span(package)
    with pytest.raises(PackageSizeError, match="truncated"):
        verify_package(package[:end], **verify_kwargs(keys))


def test_truncated_prelude_rejected(keys, package):
    with pytest.raises(PackageSizeError, match="prelude"):
        verify_package(package[:10], **verify_kwargs(keys))


def test_truncated_payload_rejected(keys, package):
    with pytest.raises(PayloadDigestError, match="bytes"):
        verify_package(package[:-ALIGN], **verify_kwargs(keys))


def test_trailing_bytes_rejected(keys, package):
    with pytest.raises(PayloadDigestError, match="bytes"):
        verify_package(package + b"\0" * 64, **verify_kwargs(keys))


def test_oversize_package_rejected(keys, package):
    with pytest.raises(PackageSizeError, match="limit"):
        verify_package(package, **verify_kwargs(keys, max_package_bytes=len(package) - 1))


def test_oversize_manifest_declaration_rejected(keys, package):
    bad = PRELUDE.pack(b"CUVLSPK\0", 1, MAX_MANIFEST_BYTES + 1, 64) + package[PRELUDE.size:]
    with pytest.raises(PackageSizeError, match="65536-byte cap"):
        verify_package(bad, **verify_kwargs(keys))


def test_wrong_signature_length_rejected(keys, package):
    magic, version, m_len, _ = PRELUDE.unpack_from(package, 0)
    bad = PRELUDE.pack(magic, version, m_len, 65) + package[PRELUDE.size:]
    with pytest.raises(PackageFormatError, match="Ed25519"):
        verify_package(bad, **verify_kwargs(keys))


def test_bad_package_magic_rejected(keys, package):
    with pytest.raises(PackageFormatError, match="magic"):
        verify_package(b"CUVLXXX\0" + package[8:], **verify_kwargs(keys))


def test_unknown_manifest_field_rejected_even_when_signed(graph, keys):
    payload = encode_payload(graph)
    doc = {**_manifest_for(payload).to_dict(), "extra": 1}
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(PackageFormatError, match="unknown field"):
        verify_package(sign_package(body, payload, keys[0]), **verify_kwargs(keys))


def test_duplicate_manifest_key_rejected_even_when_signed(graph, keys):
    payload = encode_payload(graph)
    body = _manifest_for(payload).to_bytes().replace(b'{"expires"', b'{"expires":1,"expires"', 1)
    with pytest.raises(PackageFormatError, match="twice"):
        verify_package(sign_package(body, payload, keys[0]), **verify_kwargs(keys))


def test_boolean_version_rejected_even_when_signed(graph, keys):
    payload = encode_payload(graph)
    body = _manifest_for(payload).to_bytes().replace(b'"version":5', b'"version":true')
    with pytest.raises(PackageFormatError, match="integer"):
        verify_package(sign_package(body, payload, keys[0]), **verify_kwargs(keys))


def test_signed_payload_with_misaligned_tensor_rejected(graph, keys):
    payload = mutate_header(encode_payload(graph), lambda d: d["tensors"][1].update(offset=d["tensors"][1]["offset"] + 8))
    pkg = sign_package(_manifest_for(payload).to_bytes(), payload, keys[0])
    with pytest.raises(PackageFormatError, match="multiple of 64"):
        verify_package(pkg, **verify_kwargs(keys))


# --- the order of checks is fixed (PACKAGE_SPEC §7) ---------------------------------
@pytest.mark.parametrize(
    ("description", "over", "expected"),
    [
        ("bad signature beats wrong site", dict(site="site-b", public_key=generate_keypair()[1]), SignatureError),
        ("wrong site beats wrong target", dict(site="site-b", target="npu"), WrongSiteError),
        ("wrong target beats expiry", dict(target="npu", now=EXPIRES + 1), WrongTargetError),
        ("expiry beats rollback", dict(now=EXPIRES + 1, last_version=9), ExpiredPackageError),
    ],
)
def test_check_order(keys, package, description, over, expected):
    with pytest.raises(expected):
        verify_package(package, **verify_kwargs(keys, **over))


def test_rollback_checked_before_payload_digest(keys, package):
    with pytest.raises(RollbackError):
        verify_package(flip(package, len(package) - ALIGN), **verify_kwargs(keys, last_version=5))


def test_write_package_rejects_inverted_validity(graph, keys):
    with pytest.raises(PackageFormatError, match="not after"):
        write_package(graph, SITE, TARGET, 1, keys[0], issued_at=10, expires=10)


def test_verified_package_is_frozen(keys, package):
    verified = verify_package(package, **verify_kwargs(keys))
    with pytest.raises(dataclasses.FrozenInstanceError):
        verified.size = 0  # type: ignore[misc]
    assert LIMIT > verified.size


def test_package_layer_imports_neither_torch_nor_onnx():
    import subprocess
    import sys

    code = ("import sys, cuvil_edge.ir_serialize; "
            "bad = [m for m in ('torch', 'onnx', 'opacus', 'flwr') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
