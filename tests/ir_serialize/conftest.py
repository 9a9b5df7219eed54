"""Shared builders for the package-layer tests: small Gemm/Relu graphs, keys, packages."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir_serialize import container, generate_keypair, write_package
from cuvil_edge.ir_serialize.package import assemble
from cuvil_edge.ir_serialize.signing import sign_manifest

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


@pytest.fixture(scope="session")
def keys():
    return generate_keypair()


@pytest.fixture
def package(graph, keys):
    return write_package(graph, SITE, TARGET, 5, keys[0], issued_at=ISSUED, expires=EXPIRES)


def verify_kwargs(keys, **over):
    """Arguments under which the standard ``package`` fixture verifies."""
    kw = dict(public_key=keys[1], site=SITE, target=TARGET, now=NOW, last_version=4, max_package_bytes=LIMIT)
    kw.update(over)
    return kw


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
    return build_payload(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), data)


def sign_package(manifest_bytes: bytes, payload: bytes, key) -> bytes:
    """A validly signed package around arbitrary manifest bytes and payload."""
    return assemble(manifest_bytes, sign_manifest(manifest_bytes, key), payload)


def flip(data: bytes, index: int) -> bytes:
    out = bytearray(data)
    out[index] ^= 0x01
    return bytes(out)


PKG_PRELUDE = struct.Struct("<8sIII")
