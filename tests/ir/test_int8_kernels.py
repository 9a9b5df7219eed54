"""The native int8 kernels (native_int8.c via _int8.py) against onnxruntime's own int8 execution.

Each case runs the op's kernel with the int8 branch on (this machine's native build: vpmaddubsw here
on AVX2, vpdpbusd on VNNI), on again with the library built without any -march (the portable
widening loop), and off (numpy): every result is within one quantization step of onnxruntime's, and
the three agree exactly (the int8 sums are exact on every path).

onnxruntime's own u8 x s8 kernel on AVX2 saturates vpmaddubsw's int16 pair sums (its documented
limitation), so it is not exact for 8-bit weights there: the oracle is given the same weights as uint8
(w + 128, zero point 128), which onnxruntime computes without saturation, and int8 inputs, whose
s8 x s8 kernel has the same limitation, get weights within +-64.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.ir.ops import _int8, conv, matmul

U8, I8, F32 = np.uint8, np.int8, np.float32
SOURCE = Path(_int8.__file__).with_name("native_int8.c")


def _ort(node, inputs, out_type, opset=13):
    """onnxruntime's result of the one-node model ``node`` (inputs: name -> array, the first fed)."""
    names = list(inputs)
    feed = names[0]
    proto = {np.dtype(U8): TensorProto.UINT8, np.dtype(I8): TensorProto.INT8}[inputs[feed].dtype]
    inits = [numpy_helper.from_array(v, k) for k, v in inputs.items() if k != feed]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(feed, proto, inputs[feed].shape)],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {feed: inputs[feed]})[0]


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """native_int8.c compiled without -march (no AVX2: the portable widening loop), bound as _int8 binds it."""
    out = tmp_path_factory.mktemp("int8") / "portable.so"
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-o", str(out), str(SOURCE), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    for name, (argtypes, restype) in _int8.SIGNATURES.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = argtypes, restype
    assert lib.cuvil_i8_path() == 0
    return lib


def _paths(monkeypatch, portable, call):
    """``call()`` with the int8 branch on (native build), on (portable build) and off (numpy)."""
    out = {}
    for name in ("native", "portable", "numpy"):
        with monkeypatch.context() as m:
            for module in (conv, matmul):
                m.setattr(module, "TARGET_INT8_DOT", "none" if name == "numpy" else "avx2")
            if name == "portable":
                m.setattr(_int8, "lib", lambda: portable)
            out[name] = call()
    assert _int8.path() != "none"  # the native case ran the C kernel
    return out


def _rand(rng, dtype, shape, low=None, high=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if low is None else low, (info.max if high is None else high) + 1, shape).astype(dtype)


# x shape, M, kernel, strides, pads, dilations, x dtype, w range (two weights' sum within 128: one plane)
CONV_GRID = [
    ((1, 3, 9, 11), 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), U8, 127),
    ((2, 16, 14, 14), 33, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), U8, 127),
    ((1, 7, 5, 6), 13, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), U8, 64),
    ((1, 20, 8, 8), 7, (5, 5), (2, 2), (2, 1, 0, 2), (1, 1), I8, 64),
    ((1, 8, 12, 10), 17, (3, 3), (1, 2), (0, 2, 1, 0), (2, 2), U8, 64),
    ((1, 64, 14, 14), 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), I8, 64),
    ((1, 3, 32, 32), 24, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), U8, 127),
    # stride 1 with the output as wide as the input (one copy per tap): uneven pads, dilation
    ((1, 5, 7, 9), 6, (3, 3), (1, 1), (0, 2, 1, 0), (1, 1), U8, 127),
    ((2, 4, 10, 10), 5, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), U8, 64),
    # K over one block of the GEMM (1,024) and columns in several chunks, a chunk starting mid-row
    ((1, 120, 28, 28), 9, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), U8, 64),
]


@pytest.mark.parametrize("case", CONV_GRID, ids=[f"conv{i}" for i in range(len(CONV_GRID))])
def test_q_linear_conv_matches_onnxruntime(case, monkeypatch, portable):
    shape, m, kernel, strides, pads, dilations, xdt, wmax = case
    rng = np.random.default_rng(len(CONV_GRID) + shape[1] * m)
    x = _rand(rng, xdt, shape)
    w = _rand(rng, I8, (m, shape[1], *kernel), -wmax, wmax)
    w.flags.writeable = False  # a package's initializer: packed once and kept
    xs, xz = np.array(0.03, F32), np.array(rng.integers(1, 90), xdt)
    ws = rng.uniform(0.002, 0.02, m).astype(F32)  # per output channel
    wz = np.zeros(m, I8)
    # y's scale spans the accumulator's range, so rounding (not saturation) decides most outputs
    ys, yz = np.array(float(xs) * float(ws.max()) * np.sqrt(w[0].size) * 40, F32), np.array(rng.integers(0, 20), xdt)
    b = rng.integers(-3000, 3000, m).astype(np.int32)
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "auto_pad": "NOTSET", "group": 1}
    got = _paths(monkeypatch, portable, lambda: conv.k_q_linear_conv(x, xs, xz, w, ws, wz, ys, yz, b, **attrs))
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            strides=list(strides), pads=list(pads), dilations=list(dilations))
    ow, owz = (np.array(w), wz) if xdt == I8 else ((w.astype(np.int16) + 128).astype(U8), np.full(m, 128, U8))
    want = _ort(node, {"x": x, "xs": xs, "xz": xz, "w": ow, "ws": ws, "wz": owz, "ys": ys, "yz": yz, "b": b},
                TensorProto.UINT8 if xdt == U8 else TensorProto.INT8)
    assert len(np.unique(want)) > 8  # the outputs spread over the range: the comparison means something
    for name, y in got.items():
        assert y.dtype == want.dtype and y.shape == want.shape, name
        assert np.abs(y.astype(np.int32) - want).max() <= 1, name
    assert np.array_equal(got["native"], got["numpy"]) and np.array_equal(got["portable"], got["numpy"])


@pytest.mark.parametrize("xdt,wdt", [(U8, I8), (U8, U8), (I8, I8)])
def test_conv_integer_is_exact(xdt, wdt, monkeypatch, portable):
    rng = np.random.default_rng(5)
    x, w = _rand(rng, xdt, (2, 6, 9, 8)), _rand(rng, wdt, (11, 6, 3, 3))
    xz, wz = np.array(rng.integers(0, 60), xdt), rng.integers(0, 30, 11).astype(wdt)  # per-channel w zero point
    attrs = {"strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (1, 1), "auto_pad": "NOTSET", "group": 1}
    got = _paths(monkeypatch, portable, lambda: conv.k_conv_integer(x, w, xz, wz, **attrs))
    assert all(np.array_equal(y, got["numpy"]) and y.dtype == np.int32 for y in got.values())
    if xdt == U8:  # onnxruntime's ConvInteger takes uint8 x (and a per-tensor w zero point)
        node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], strides=[2, 1], pads=[1, 0, 1, 2])
        wz0 = np.array(wz[0], wdt)
        want = _ort(node, {"x": x, "w": w, "xz": xz, "wz": wz0}, TensorProto.INT32)
        assert np.array_equal(conv.k_conv_integer(x, w, xz, wz0, **attrs), want)


# a shape, K, N, a dtype, b dtype
MATMUL_GRID = [((3, 5), 5, 7, U8, I8), ((2, 4, 33), 33, 17, U8, U8), ((1, 512), 512, 100, U8, I8), ((9, 70), 70, 40, I8, I8)]


@pytest.mark.parametrize("case", MATMUL_GRID, ids=[f"mm{i}" for i in range(len(MATMUL_GRID))])
def test_q_linear_mat_mul_matches_onnxruntime(case, monkeypatch, portable):
    shape, k, n, adt, bdt = case
    rng = np.random.default_rng(k + n)
    a = _rand(rng, adt, shape)
    b = _rand(rng, bdt, (k, n), *((-64, 64) if adt == I8 else (None, None)))
    az, bz = np.array(rng.integers(1, 50), adt), np.array(rng.integers(0, 9), bdt)
    as_, bs = np.array(0.05, F32), rng.uniform(0.003, 0.01, n).astype(F32)  # b per column
    ys, yz = np.array(float(as_) * float(bs.max()) * np.sqrt(k) * 60, F32), np.array(7, adt)
    got = _paths(monkeypatch, portable, lambda: matmul.k_q_linear_mat_mul(a, as_, az, b, bs, bz, ys, yz))
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    ob, obz = (b, np.full(n, bz, bdt)) if adt == I8 or bdt == U8 else (
        (b.astype(np.int16) + 128).astype(U8), np.full(n, int(bz) + 128, U8))  # the same values, unsaturated
    want = _ort(node, {"a": a, "as": as_, "az": az, "b": ob, "bs": bs, "bz": obz, "ys": ys, "yz": yz},
                TensorProto.UINT8 if adt == U8 else TensorProto.INT8, opset=21)
    for name, y in got.items():
        assert y.shape == want.shape and np.abs(y.astype(np.int32) - want).max() <= 1, name
    assert np.array_equal(got["native"], got["numpy"]) and np.array_equal(got["portable"], got["numpy"])
    integer = _paths(monkeypatch, portable, lambda: matmul.k_mat_mul_integer(a, b, az, bz))
    assert all(np.array_equal(y, integer["numpy"]) for y in integer.values())


def test_a_weight_is_packed_once_while_it_lives():
    rng = np.random.default_rng(0)
    w = _rand(rng, I8, (8, 4, 3, 3))
    w.flags.writeable = False
    x = _rand(rng, U8, (1, 4, 6, 6))
    before = len(_int8._packed)
    for _ in range(3):
        _int8.conv(x, None, w, None, None, None, None, np.int32, (1, 1), (0, 0, 0, 0), (1, 1), (4, 4), 1)
    assert len(_int8._packed) == before + 1
    del w
    assert len(_int8._packed) == before  # dropped with the array: a recycled id never finds it
