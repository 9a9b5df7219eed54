"""Property tests: random small Gemm/Relu graphs round-trip; any corruption gives a typed PackageError."""

from __future__ import annotations

import numpy as np
from conftest import EXPIRES, ISSUED, NOW, SITE, TARGET, make_keys, make_trust, mlp_graph, verify
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuvil_edge.errors import PackageError
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir_serialize import encode_payload, write_package
from cuvil_edge.ir_serialize.container import _decode_payload
from cuvil_edge.ir_serialize.manifest import Manifest

KEYS = make_keys()
TRUST = make_trust(KEYS)[1]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mlp_graphs(draw):
    """A chain of 1..3 (Gemm [+ Relu]) layers with random widths, dtype, bias and transB."""
    dtype = draw(st.sampled_from(["float32", "float64"]))
    widths = draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    nodes, inits, current = [], {}, "x"
    for i, (k, n) in enumerate(zip(widths, widths[1:])):
        trans_b = draw(st.booleans())
        inits[f"w{i}"] = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
        inputs = (current, f"w{i}")
        if draw(st.booleans()):
            inits[f"b{i}"] = rng.standard_normal(n).astype(dtype)
            inputs += (f"b{i}",)
        nodes.append(Node(f"fc{i}", "Gemm", inputs, (f"h{i}",), {"transB": int(trans_b), "alpha": draw(st.floats(-2, 2))}))
        current = f"h{i}"
        if draw(st.booleans()):
            nodes.append(Node(f"relu{i}", "Relu", (current,), (f"r{i}",)))
            current = f"r{i}"
    batch = draw(st.sampled_from(["batch", 1, 7]))
    return build_graph("g", [Value("x", TensorType(dtype, (batch, widths[0])))], [current], nodes, inits, 13)


@SETTINGS
@given(graph=mlp_graphs(), version=st.integers(1, 2**40), counter=st.integers(0, 2**40),
       nonce=st.one_of(st.none(), st.text(min_size=1, max_size=20).filter(lambda t: all(ord(c) >= 32 and ord(c) != 127 for c in t))),
       lifetime=st.integers(NOW - ISSUED + 1, 2**31))
def test_random_graphs_and_manifests_round_trip_through_signed_packages(graph, version, counter, nonce, lifetime):
    pkg = write_package(graph, SITE, TARGET, version, KEYS["coordinator"], issued_at=ISSUED, expires=ISSUED + lifetime,
                        release_key=KEYS["release"], release_counter=counter, nonce=nonce)
    verified = verify(pkg, TRUST, state=None, max_package_bytes=len(pkg), expected_nonce=nonce)
    assert verified.graph.to_dict() == graph.to_dict()
    m = verified.manifest
    assert (m.version, m.nonce, m.expires, verified.release.release_counter) == (version, nonce, ISSUED + lifetime, counter)
    assert Manifest.from_bytes(m.to_bytes()) == m
    whole = np.frombuffer(pkg, dtype=np.uint8)
    for name, array in graph.initializers.items():
        got = verified.graph.initializers[name]
        assert got.dtype == array.dtype and got.tobytes() == array.tobytes()
        assert np.shares_memory(got, whole)


PKG = write_package(mlp_graph(), SITE, TARGET, 5, KEYS["coordinator"], issued_at=ISSUED, expires=EXPIRES,
                    release_key=KEYS["release"])
PAYLOAD = encode_payload(mlp_graph())


def _verify(data: bytes):
    return verify(data, TRUST, state=None)


@SETTINGS
@given(index=st.integers(0, len(PKG) - 1), mask=st.integers(1, 255))
def test_any_package_byte_flip_is_a_typed_rejection(index, mask):
    bad = bytearray(PKG)
    bad[index] ^= mask
    try:
        _verify(bytes(bad))
    except PackageError:
        return
    # Only the zero padding inside the *payload* is unsigned-but-hashed; nothing may pass.
    raise AssertionError(f"flipping byte {index} was accepted")


@SETTINGS
@given(cut=st.integers(0, len(PKG) - 1))
def test_any_truncation_is_a_typed_rejection(cut):
    try:
        _verify(PKG[:cut])
    except PackageError:
        return
    raise AssertionError(f"truncation to {cut} bytes was accepted")


@SETTINGS
@given(index=st.integers(0, len(PAYLOAD) - 1), mask=st.integers(1, 255))
def test_any_payload_byte_flip_decodes_or_fails_with_a_typed_error(index, mask):
    # The container alone does not authenticate its header (the signed manifest does), so a flip
    # that still describes a valid graph (e.g. "version":13 -> 12) may decode; anything else must
    # be a PackageError, never an IndexError, KeyError, numpy error ...
    bad = bytearray(PAYLOAD)
    bad[index] ^= mask
    try:
        decoded = _decode_payload(bytes(bad))
    except PackageError:
        return
    assert {k: a.tobytes() for k, a in decoded.initializers.items()} == {
        k: a.tobytes() for k, a in mlp_graph().initializers.items()}
