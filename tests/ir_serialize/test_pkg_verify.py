"""verify_package: the happy paths, then one named test per attack (PACKAGE_SPEC §12)."""

from __future__ import annotations

import dataclasses
import json
import mmap

import numpy as np
import pytest
from conftest import (EXPIRES, ISSUED, LIMIT, NOW, PKG_PRELUDE, SITE, STATE, TARGET, accept_kwargs, envelope_doc, flip,
                      make_keys, make_package, make_trust, mlp_graph, open_state, reassemble, resign, verify)

from cuvil_edge.errors import (
    BadNameError, BadSignatureError, ClockRollbackError, DeclaredLengthError, DigestConflictError, DuplicateKeyError,
    ExpiredPackageError, ExpiredRootError, ManifestMismatchError, NonceError, PackageError, PackageFormatError,
    RegionDigestError, RegionLayoutError, ReleaseRollbackError, RevokedKeyError, RollbackError, RootChainTooLongError,
    RootRotationError, SealingError, ThresholdError, TrailingDataError, TruncatedPackageError, UnsupportedFormatError,
    UntrustedKeyError, WrongSealKeyError, WrongSiteError, WrongTargetError,
)
from cuvil_edge.ir_serialize import AcceptedVersion, load_pinned_root, make_root, open_package, sign_root
from cuvil_edge.ir_serialize.container import ALIGN
from cuvil_edge.ir_serialize.sealing import generate_seal_keypair
from cuvil_edge.ir_serialize.trust import MAX_ROOT_CHAIN, update_root


def _verify(pkg, trust, **over):
    return verify(pkg, trust, **over)


def _regions(pkg):
    doc, _ = envelope_doc(pkg)
    import base64
    return json.loads(base64.b64decode(doc["manifest"]["payload"]))["regions"], len(pkg) - len(envelope_doc(pkg)[1])


# --- happy paths --------------------------------------------------------------------------
def test_round_trip(graph, keys, trust, package):
    v = _verify(package, trust)
    assert v.manifest.site == SITE and v.manifest.version == 5 and v.release.release_counter == 3
    assert v.graph.to_dict() == graph.to_dict()
    for name, array in graph.initializers.items():
        np.testing.assert_array_equal(v.graph.initializers[name], array)


def test_first_package_accepted_with_empty_state(trust, package):
    assert _verify(package, trust, state=None).manifest.version == 5


def test_same_version_same_digest_is_idempotent(trust, package):
    digest = _verify(package, trust).manifest_digest
    state = dataclasses.replace(STATE, sites={SITE: AcceptedVersion(5, digest)})
    assert _verify(package, trust, state=state).manifest_digest == digest


def test_open_package_maps_file_without_copying(tmp_path, trust, package):
    path = tmp_path / "p.cpkg"
    path.write_bytes(package)
    v = open_package(path, open_state(tmp_path / "state", trust), **accept_kwargs())
    w = v.graph.initializers["w1"]
    assert not w.flags.writeable and w.ctypes.data % ALIGN == 0
    base = w.base
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "obj", None) or getattr(base, "base", None)
    assert isinstance(base, mmap.mmap)


def test_sealed_round_trip(graph, keys, trust):
    private, public = generate_seal_keypair()
    pkg = make_package(graph, keys, seal_to=public)
    v = _verify(pkg, trust, seal_key=private)
    np.testing.assert_array_equal(v.graph.initializers["w2"], graph.initializers["w2"])


# --- tampering: one byte in each region ------------------------------------------------------
def test_tampered_envelope_byte_rejected(trust, package):
    with pytest.raises(PackageFormatError):
        _verify(flip(package, PKG_PRELUDE.size), trust)  # the envelope's opening '{'


def test_tampered_manifest_byte_rejected(keys, trust, package):
    doc, payload = envelope_doc(package)
    import base64
    body = bytearray(base64.b64decode(doc["manifest"]["payload"]))
    body[body.index(b'"version":5')+10] = ord("6")
    doc["manifest"]["payload"] = base64.b64encode(bytes(body)).decode()
    with pytest.raises(BadSignatureError):
        _verify(reassemble(doc, payload), trust)


def test_tampered_release_byte_rejected(trust, package):
    doc, payload = envelope_doc(package)
    import base64
    body = base64.b64decode(doc["release"]["payload"]).replace(b'"release_counter":3', b'"release_counter":9')
    doc["release"]["payload"] = base64.b64encode(body).decode()
    with pytest.raises(BadSignatureError):
        _verify(reassemble(doc, payload), trust)


def test_tampered_signature_rejected(trust, package):
    doc, payload = envelope_doc(package)
    sig = doc["manifest"]["signatures"][0]["sig"]
    doc["manifest"]["signatures"][0]["sig"] = ("B" if sig[0] == "A" else "A") + sig[1:]
    with pytest.raises(BadSignatureError):
        _verify(reassemble(doc, payload), trust)


def test_tampered_header_byte_rejected(trust, package):
    start = len(package) - len(envelope_doc(package)[1])
    with pytest.raises(RegionDigestError):
        _verify(flip(package, start + 40), trust)


@pytest.mark.parametrize("tensor", ["b1", "w1", "w2"])
def test_tampered_tensor_byte_rejected(trust, package, tensor):
    regions, start = _regions(package)
    region = next(r for r in regions if r["name"] == tensor)
    with pytest.raises(RegionDigestError):
        _verify(flip(package, start + region["offset"] + region["length"] - 1), trust)


# --- keys and thresholds -----------------------------------------------------------------------
def test_untrusted_key_rejected(graph, trust):
    with pytest.raises(UntrustedKeyError):
        _verify(make_package(graph, make_keys()), trust)


def test_below_threshold_rejected(graph, keys):
    extra = make_keys()
    role_keys = {"root": [keys["root"].public_key()], "release": [keys["release"].public_key()],
                 "coordinator": [keys["coordinator"].public_key(), extra["coordinator"].public_key()]}
    root = sign_root(make_root(1, EXPIRES + 10, role_keys, {"coordinator": 2}), [keys["root"]])
    with pytest.raises(ThresholdError):
        _verify(make_package(graph, keys), root)
    both = make_package(graph, keys, signing_key=[keys["coordinator"], extra["coordinator"]])
    assert _verify(both, root).manifest.version == 5


def test_revoked_key_rejected(graph, keys, trust):
    new_coord = make_keys()["coordinator"]
    role_keys = {"root": [keys["root"].public_key()], "release": [keys["release"].public_key()],
                 "coordinator": [new_coord.public_key()]}
    v2 = json.loads(sign_root(make_root(2, EXPIRES + 10, role_keys), [keys["root"]]))
    with pytest.raises(RevokedKeyError):
        _verify(make_package(graph, keys, roots=[v2]), trust)
    assert _verify(make_package(graph, keys, signing_key=new_coord, roots=[v2]), trust).root_version == 2


# --- addressing, freshness, versions --------------------------------------------------------------
def test_valid_package_for_other_site_rejected(graph, keys, trust):
    with pytest.raises(WrongSiteError):
        _verify(make_package(graph, keys, site="site-b"), trust)


def test_valid_package_for_other_target_kind_rejected(graph, keys, trust):
    with pytest.raises(WrongTargetError):
        _verify(make_package(graph, keys, target="gpu-y"), trust)


def test_manifest_target_not_in_release_rejected(keys, trust, package):
    bad = resign(package, keys, manifest=lambda m: m.update(target="gpu-y"))
    with pytest.raises(WrongTargetError):
        _verify(bad, trust, target="gpu-y")


def test_expired_rejected(trust, package):
    with pytest.raises(ExpiredPackageError):
        _verify(package, trust, now=EXPIRES)


def test_clock_set_back_rejected_by_time_floor(trust, package):
    state = dataclasses.replace(STATE, time_floor=EXPIRES + 5)
    with pytest.raises(ClockRollbackError):
        _verify(package, trust, state=state)  # now (NOW) is before expires, but the floor is not


def test_issued_in_future_rejected(trust, package):
    with pytest.raises(ExpiredPackageError):
        _verify(package, trust, now=ISSUED - 1000, state=None)


def test_older_version_rejected(trust, package):
    with pytest.raises(RollbackError):
        _verify(package, trust, state=dataclasses.replace(STATE, sites={SITE: AcceptedVersion(6, "0" * 64)}))


def test_same_version_other_digest_rejected(trust, package):
    with pytest.raises(DigestConflictError):
        _verify(package, trust, state=dataclasses.replace(STATE, sites={SITE: AcceptedVersion(5, "0" * 64)}))


def test_release_counter_rollback_rejected(trust, package):
    with pytest.raises(ReleaseRollbackError):
        _verify(package, trust, state=dataclasses.replace(STATE, releases={"model": 4}))


def test_replayed_nonce_rejected(graph, keys, trust):
    pkg = make_package(graph, keys, nonce="n-1")
    assert _verify(pkg, trust, expected_nonce="n-1").manifest.nonce == "n-1"
    with pytest.raises(NonceError):
        _verify(pkg, trust, expected_nonce="n-2")


# --- mix-and-match, deleted and swapped regions ---------------------------------------------------
def test_region_from_other_package_rejected(keys, trust, package):
    other = make_package(mlp_graph(seed=7), keys)
    regions, start = _regions(package)
    r = next(x for x in regions if x["name"] == "w1")
    a, b = start + r["offset"], start + r["offset"] + r["length"]
    with pytest.raises(RegionDigestError):
        _verify(package[:a] + other[a:b] + package[b:], trust)


def test_release_from_other_package_rejected(keys, trust, package):
    other = make_package(mlp_graph(seed=7), keys)
    doc, payload = envelope_doc(package)
    doc["release"] = envelope_doc(other)[0]["release"]
    with pytest.raises(ManifestMismatchError):
        _verify(reassemble(doc, payload), trust)


def test_region_deleted_rejected(keys, trust, package):
    bad = resign(package, keys, manifest=lambda m: m["regions"].pop())  # a compromised coordinator key
    with pytest.raises(ManifestMismatchError):
        _verify(bad, trust)


def test_regions_swapped_rejected(keys, trust, package):
    def swap(m):
        r = m["regions"]
        r[1]["sha256"], r[2]["sha256"] = r[2]["sha256"], r[1]["sha256"]
    with pytest.raises(ManifestMismatchError):
        _verify(resign(package, keys, manifest=swap), trust)


# --- truncation, trailing bytes, lengths, layout ----------------------------------------------------
def test_truncated_at_every_region_boundary_rejected(trust, package):
    regions, start = _regions(package)
    cuts = [0, 8, PKG_PRELUDE.size - 1, PKG_PRELUDE.size + 10, start] + \
           [start + r["offset"] + r["length"] for r in regions] + [start + r["offset"] for r in regions[1:]]
    for cut in sorted(set(c for c in cuts if c < len(package))):
        with pytest.raises(PackageError) as info:
            _verify(package[:cut], trust)
        assert isinstance(info.value, (TruncatedPackageError, PackageFormatError)), (cut, info.value)
    with pytest.raises(TruncatedPackageError):
        _verify(package[:-1], trust)


def test_trailing_bytes_rejected(trust, package):
    with pytest.raises(TrailingDataError):
        _verify(package + b"\0" * 64, trust)


def test_declared_envelope_length_max_rejected(trust, package):
    bad = bytearray(package)
    PKG_PRELUDE.pack_into(bad, 0, b"CUVLSPK\0", 2, 2**32 - 1, 0)
    with pytest.raises(DeclaredLengthError):
        _verify(bytes(bad), trust)


def test_declared_payload_length_huge_rejected(keys, trust, package):
    with pytest.raises(DeclaredLengthError):
        _verify(resign(package, keys, manifest=lambda m: m.update(payload_length=2**63 - 1)), trust)


@pytest.mark.parametrize("offset_delta", [-64, 64, 1], ids=["overlap", "gap", "unaligned"])
def test_bad_manifest_region_layout_rejected(keys, trust, package, offset_delta):
    def shift(m):
        m["regions"][2]["offset"] += offset_delta
    bad = resign(package, keys, manifest=shift, release=None)
    with pytest.raises(RegionLayoutError):
        _verify(bad, trust)


def test_unknown_package_version_rejected(trust, package):
    bad = bytearray(package)
    bad[8] = 3
    with pytest.raises(UnsupportedFormatError):
        _verify(bytes(bad), trust)


def test_unknown_manifest_format_rejected(keys, trust, package):
    with pytest.raises(UnsupportedFormatError):
        _verify(resign(package, keys, manifest=lambda m: m.update(format=3)), trust)


def test_unknown_manifest_field_rejected(keys, trust, package):
    with pytest.raises(UnsupportedFormatError):
        _verify(resign(package, keys, manifest=lambda m: m.update(extra=1)), trust)


def test_duplicate_json_keys_in_envelope_rejected(trust, package):
    doc, payload = envelope_doc(package)
    env = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    env = env[:-1] + b',"roots":[]}'
    head = PKG_PRELUDE.pack(b"CUVLSPK\0", 2, len(env), 0) + env
    with pytest.raises(DuplicateKeyError):
        _verify(head + bytes(-len(head) % 64) + payload, trust)


@pytest.mark.parametrize("site", ["../etc", "a/b", "a\0b"], ids=["dotdot", "slash", "nul"])
def test_path_like_site_name_rejected(keys, trust, package, site):
    with pytest.raises(BadNameError):
        _verify(resign(package, keys, manifest=lambda m: m.update(site=site)), trust, site=site)


# --- trust root -------------------------------------------------------------------------------
def _v(keys, version, root_key):
    role_keys = {"root": [root_key.public_key()], "release": [keys["release"].public_key()],
                 "coordinator": [keys["coordinator"].public_key()]}
    return make_root(version, EXPIRES + 10, role_keys)


def test_root_rotation_not_signed_by_old_keys_rejected(keys, trust):
    attacker = make_keys()["root"]
    with pytest.raises(RootRotationError):
        update_root(load_pinned_root(trust), sign_root(_v(keys, 2, attacker), [attacker]))


def test_root_rotation_not_signed_by_new_keys_rejected(keys, trust):
    new = make_keys()["root"]
    with pytest.raises(RootRotationError):
        update_root(load_pinned_root(trust), sign_root(_v(keys, 2, new), [keys["root"]]))


def test_root_rotation_skipping_a_version_rejected(keys, trust):
    with pytest.raises(RootRotationError):
        update_root(load_pinned_root(trust), sign_root(_v(keys, 3, keys["root"]), [keys["root"]]))


def test_root_chain_in_package_applied(graph, keys, trust):
    new = make_keys()["root"]
    v2 = json.loads(sign_root(_v(keys, 2, new), [keys["root"], new]))
    v = _verify(make_package(graph, keys, roots=[v2]), trust)
    assert v.root_version == 2


def test_root_chain_too_long_rejected(graph, keys, trust):
    chain = [json.loads(sign_root(_v(keys, i, keys["root"]), [keys["root"]])) for i in range(2, MAX_ROOT_CHAIN + 3)]
    with pytest.raises(RootChainTooLongError):
        _verify(make_package(graph, keys, roots=chain), trust)


def test_expired_root_rejected(keys, package):
    _, root = make_trust(keys, expires=NOW - 1)
    with pytest.raises(ExpiredRootError):
        _verify(package, root)


# --- sealing --------------------------------------------------------------------------------------
def test_sealed_package_opened_with_other_sites_key_rejected(graph, keys, trust):
    _, public = generate_seal_keypair()
    other, _ = generate_seal_keypair()
    with pytest.raises(WrongSealKeyError):
        _verify(make_package(graph, keys, seal_to=public), trust, seal_key=other)


def test_sealed_chunk_tampered_rejected(graph, keys, trust):
    private, public = generate_seal_keypair()
    pkg = make_package(graph, keys, seal_to=public)
    with pytest.raises(SealingError):
        _verify(flip(pkg, len(pkg) - 20), trust, seal_key=private)


def test_oversize_package_rejected_before_parsing(trust, package):
    with pytest.raises(PackageError):
        _verify(package, trust, max_package_bytes=len(package) - 1)
    assert LIMIT > len(package) and TARGET
