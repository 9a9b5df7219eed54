"""Shared builders for the package-layer tests: small Gemm/Relu graphs, keys, packages."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir_serialize import (
    AcceptedVersion, AntiRollbackState, RollbackSnapshot, container, generate_keypair, load_pinned_root, make_root,
    sign_root, verify_and_accept, write_package,
)
from cuvil_edge.ir_serialize.dsse import sign_envelope
from cuvil_edge.ir_serialize.manifest import MANIFEST_TYPE, RELEASE_TYPE

SITE, TARGET = "site-a", "cpu-x86"
ISSUED, EXPIRES, NOW = 1_700_000_000, 1_700_600_000, 1_700_000_100
LIMIT = 1 << 20


def mlp_graph(seed: int = 0):
    """x[batch,4] -> Gemm(W1[3,4]^T, b1) -> Relu -> Gemm(W2[3,2]) -> y[batch,2]."""
    rng = np.random.default_rng(seed)
    nodes = [
        Node("fc1", "Gemm", ("x", "w1", "b1"), ("h",), {"transB": 1, "alpha": 1.0}),
        Node("act", "Relu", ("h",), ("a",)),
        Node("fc2", "Gemm", ("a", "w2"), ("y",), {"beta": 0.5}),
    ]
    inits = {
        "w1": rng.standard_normal((3, 4)).astype(np.float32),
        "b1": rng.standard_normal(3).astype(np.float32),
        "w2": rng.standard_normal((3, 2)).astype(np.float32),
    }
    return build_graph("mlp", [Value("x", TensorType("float32", ("batch", 4)))], ["y"], nodes, inits, 13)


@pytest.fixture
def graph():
    return mlp_graph()


def make_keys():
    """One private key per role."""
    return {role: generate_keypair()[0] for role in ("root", "release", "coordinator")}


def make_trust(keys, version=1, expires=EXPIRES + 10**6, thresholds=None):
    """(TrustRoot, root.json bytes) with one key per role, self-signed by the root key."""
    root = make_root(version, expires, {r: [k.public_key()] for r, k in keys.items()}, thresholds)
    data = sign_root(root, [keys["root"]])
    return load_pinned_root(data), data


@pytest.fixture(scope="session")
def keys():
    return make_keys()


@pytest.fixture(scope="session")
def trust(keys):
    """The pinned root.json bytes agents start from."""
    return make_trust(keys)[1]


def make_package(graph, keys, version=5, **over):
    kw = dict(issued_at=ISSUED, expires=EXPIRES, release_key=keys["release"], release_counter=3)
    kw.update(over)
    site, target = kw.pop("site", SITE), kw.pop("target", TARGET)
    return write_package(graph, site, target, version, kw.pop("signing_key", keys["coordinator"]), **kw)


@pytest.fixture
def package(graph, keys):
    return make_package(graph, keys)


STATE = RollbackSnapshot(time_floor=ISSUED - 10, sites={SITE: AcceptedVersion(4, "0" * 64)}, releases={"model": 2})


def accept_kwargs(**over):
    """Arguments under which the standard ``package`` fixture verifies."""
    kw = dict(site=SITE, target=TARGET, now=NOW, max_package_bytes=LIMIT)
    kw.update(over)
    return kw


def open_state(directory: Path, root_json: bytes, snapshot: RollbackSnapshot | None = STATE) -> AntiRollbackState:
    """A state directory initialised from ``root_json`` and seeded with ``snapshot``'s floors."""
    state = AntiRollbackState(directory)
    root = state.initialise(root_json)
    if snapshot is not None:
        with state.transaction() as txn:
            txn.commit(dataclasses.replace(txn.current, snapshot=dataclasses.replace(snapshot, root_version=root.version)))
    return state


def verify(pkg, root_json: bytes, *, state: RollbackSnapshot | None = STATE, **over):
    """``verify_and_accept`` of ``pkg`` against a fresh state pinned to ``root_json`` with ``state``'s floors."""
    with tempfile.TemporaryDirectory() as d:
        return verify_and_accept(pkg, open_state(Path(d), root_json, state), **accept_kwargs(**over))


def state_bytes(state: AntiRollbackState) -> bytes:
    return state.path.read_bytes()


def envelope_doc(pkg: bytes):
    """(outer envelope dict, payload bytes) of a package."""
    _, _, n, _ = PKG_PRELUDE.unpack_from(pkg, 0)
    s = PKG_PRELUDE.size
    return json.loads(pkg[s:s + n]), pkg[container.align(s + n):]


def reassemble(doc, payload: bytes) -> bytes:
    """A package from an (edited) envelope dict and payload, laid out correctly."""
    env = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    head = PKG_PRELUDE.pack(b"CUVLSPK\0", 2, len(env), 0) + env
    return head + bytes(container.align(len(head)) - len(head)) + payload


def resign(pkg: bytes, keys, *, manifest=None, release=None, payload=None, manifest_keys=None, release_keys=None):
    """Edit the decoded manifest/release dicts (callables) and re-sign them with trusted (or given) keys."""
    doc, body = envelope_doc(pkg)
    rel_body = base64.b64decode(doc["release"]["payload"])
    if release is not None:
        d = json.loads(rel_body)
        release(d)
        rel_body = _canon(d)
    rel = sign_envelope(RELEASE_TYPE, rel_body, release_keys or [keys["release"]])
    man = json.loads(base64.b64decode(doc["manifest"]["payload"]))
    man["release_sha256"] = hashlib.sha256(rel_body).hexdigest()
    if manifest is not None:
        manifest(man)
    m = sign_envelope(MANIFEST_TYPE, _canon(man) if not isinstance(man, bytes) else man,
                      manifest_keys or [keys["coordinator"]])
    doc["manifest"], doc["release"] = m.to_dict(), rel.to_dict()
    return reassemble(doc, body if payload is None else payload)


def _canon(d) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def split_payload(payload: bytes) -> tuple[bytes, bytes]:
    """(header bytes, data section) of a container."""
    _, _, _, n = container.PRELUDE.unpack_from(payload, 0)
    start = container.PRELUDE.size
    return payload[start:start + n], payload[container.align(start + n):]


def build_payload(header: bytes, data: bytes) -> bytes:
    """A container from raw header bytes and a data section, with correct prelude and padding."""
    pre = container.PRELUDE.pack(container.MAGIC, 1, 0, len(header)) + header
    return pre + bytes(container.align(len(pre)) - len(pre)) + data


def mutate_header(payload: bytes, change) -> bytes:
    """Re-encode the payload with ``change(header_dict)`` applied (still canonical JSON)."""
    header, data = split_payload(payload)
    doc = json.loads(header)
    change(doc)
    return build_payload(json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(), data)


def flip(data: bytes, index: int) -> bytes:
    out = bytearray(data)
    out[index] ^= 0x01
    return bytes(out)


PKG_PRELUDE = struct.Struct("<8sIII")


def sign_raw_payload(payload: bytes, tensors, keys, version=5) -> bytes:
    """A package signing ``payload`` as is (its header may be unparseable): ``tensors`` are the
    (name, offset in the data section, length, sha256) rows the regions should list."""
    from cuvil_edge.ir_serialize.manifest import Manifest, Region, ReleaseStatement
    from cuvil_edge.ir_serialize.package import assemble

    _, _, _, n = container.PRELUDE.unpack_from(payload, 0)
    start = container.align(container.PRELUDE.size + n)
    regions = (Region("header", "", 0, start, hashlib.sha256(payload[:start]).hexdigest()),) + tuple(
        Region("tensor", name, start + offset, length, digest) for name, offset, length, digest in tensors)
    rel_body = ReleaseStatement("model", 3, (TARGET,), regions).to_bytes()
    release = sign_envelope(RELEASE_TYPE, rel_body, [keys["release"]])
    manifest = Manifest("model", SITE, TARGET, version, ISSUED, EXPIRES, None, hashlib.sha256(rel_body).hexdigest(),
                        len(payload), None, regions)
    return assemble(sign_envelope(MANIFEST_TYPE, manifest.to_bytes(), [keys["coordinator"]]), release, payload)


def tensor_rows(payload: bytes):
    """The (name, offset, length, sha256) rows of a well-formed container."""
    return [(e.name, e.offset, e.length, e.sha256) for e in container.read_layout(memoryview(payload)).entries]


def cap_address_space(gib: float) -> None:
    """Limit this process's address space (fuzzers: a memory blow-up fails fast instead of swapping)."""
    try:
        import resource

        cap = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):
        pass
