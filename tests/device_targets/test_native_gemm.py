"""The native GEMM (native_gemm.c) behind dense 2-D convolutions: equal to onnxruntime and to the
numpy path over shapes that are not multiples of its tiles or blocks, its weights packed once per
read-only array, and the one path decision (``conv_path``) that k_conv, the memory plan and the
cost model share."""

from __future__ import annotations

import gc

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.device_targets import build, load_target, memory_plan
from cuvil_edge.device_targets.cost_model import predict
from cuvil_edge.frontend import load_model
from cuvil_edge.ir.ops import _native, _packing, _scratch, conv
from cuvil_edge.passes import optimize

from native_targets import NATIVE, NUMPY, needs_compiler
from native_targets import Package as _Package



def _conv_model(n, c, size, m, kernel, strides, pads, dilations, bias, act):
    rng = np.random.default_rng(c * 100 + m)
    inits = [("w", (rng.standard_normal((m, c) + kernel) / np.sqrt(c * np.prod(kernel))).astype(np.float32))]
    if bias:
        inits.append(("b", rng.standard_normal(m).astype(np.float32)))
    nodes = [helper.make_node("Conv", ["x", "w"] + ["b"] * bias, ["t" if act else "y"], strides=list(strides),
                              pads=list(pads), dilations=list(dilations))]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    elif act == "Clip":
        inits += [("lo", np.array(0, np.float32)), ("hi", np.array(6, np.float32))]
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    elif act:
        nodes.append(helper.make_node(act, ["t"], ["y"]))
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)],
                              [numpy_helper.from_array(a, name) for name, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = (rng.standard_normal((n, c, *size)) * 2).astype(np.float32)
    return model, x


# (batch, channels, (h, w), outputs, kernel, strides, pads, dilations, bias, activation)
SHAPES = [
    (1, 3, (9, 7), 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, None),  # M, N, K under one tile
    (1, 1, (5, 5), 1, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), False, None),  # K = 1, M = 1
    (2, 7, (13, 11), 13, (3, 3), (2, 2), (1, 0, 2, 1), (1, 1), True, "Relu"),  # batch, odd strides and pads
    (3, 17, (11, 12), 19, (5, 3), (1, 2), (2, 1, 2, 1), (2, 1), True, "Clip"),  # dilation, non-square
    (1, 40, (6, 6), 150, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, None),  # K 360 > KC, M 150 > MC
    (1, 5, (50, 47), 9, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False, "Relu"),  # N 2350 > NC
    (2, 300, (1, 1), 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True, None),  # N = 1 (a pixel), K 300
    (1, 16, (14, 14), 24, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), True, None),  # strided 1x1
    (1, 8, (4, 4), 6, (1, 1), (1, 1), (1, 1, 1, 1), (1, 1), True, "Sigmoid"),  # padded 1x1, transcendental
    (2, 6, (10, 10), 20, (7, 7), (3, 3), (3, 3, 3, 3), (1, 1), True, "HardSwish"),  # big kernel, stride 3
    (1, 3, (2, 2), 4, (3, 3), (1, 1), (2, 2, 2, 2), (1, 1), True, "Relu"),  # more padding than input
]


@needs_compiler
@pytest.mark.parametrize("case", SHAPES, ids=lambda c: "x".join(map(str, (c[0], c[1], *c[2], c[3], *c[4]))))
def test_the_native_gemm_convolution_matches_onnxruntime_and_the_numpy_path(tmp_path, case):
    model, x = _conv_model(*case)
    graph, _ = optimize(load_model(model))
    native = build(_Package(graph), NATIVE, cache_dir=tmp_path)
    numpy_only = build(_Package(graph), NUMPY, cache_dir=tmp_path)
    assert "cuvil_conv_gemm_f32" in native.source and "cuvil_conv_gemm_f32" not in numpy_only.source
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, reference = native.run({"x": x})["y"], numpy_only.run({"x": x})["y"]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * scale)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=2e-6 * scale)


def _c_library(monkeypatch):
    """The C library itself, for the tests of its functions (loaded even under CUVIL_EDGE_NATIVE=0,
    which only keeps modules off it)."""
    monkeypatch.setenv("CUVIL_EDGE_NATIVE", "1")
    return _native._load()


@needs_compiler
def test_the_store_adds_the_residual_and_clamps(monkeypatch):
    lib = _c_library(monkeypatch)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 5, 6)).astype(np.float32)
    w = rng.standard_normal((11, 9, 3, 3)).astype(np.float32)
    b, res = rng.standard_normal(11).astype(np.float32), rng.standard_normal((2, 11, 5, 6)).astype(np.float32)
    y = np.empty_like(res)
    panels, address = _packing.packed_weights(lib, w)
    shape = np.array([2, 9, 5, 6, 11, 3, 3, 1, 1, 1, 1, 1, 1, 5, 6], np.int64)
    assert lib.cuvil_conv_gemm_f32(address, x.ctypes.data, b.ctypes.data, res.ctypes.data, y.ctypes.data,
                                   shape.ctypes.data, 0.0, 6.0) == 0
    want = conv.k_conv(x, w, b, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), auto_pad="NOTSET", group=1)
    np.testing.assert_allclose(y, np.clip(want + res, 0, 6), rtol=1e-5, atol=1e-5)


@needs_compiler
def test_read_only_weights_are_packed_once_and_writable_ones_every_call(monkeypatch):
    lib, packs = _c_library(monkeypatch), []
    monkeypatch.setattr(lib, "cuvil_gemm_pack_a_f32", lambda *a, f=lib.cuvil_gemm_pack_a_f32: (packs.append(1), f(*a)))
    w = np.random.default_rng(4).standard_normal((8, 4, 3, 3)).astype(np.float32)
    first = _packing.packed_weights(lib, w)[0]
    assert _packing.packed_weights(lib, w)[0] is not first and len(packs) == 2  # writable: it may change
    w.flags.writeable = False
    first = _packing.packed_weights(lib, w)[0]
    assert _packing.packed_weights(lib, w)[0] is first and len(packs) == 3  # read-only: packed once
    copy = w.copy()
    copy.flags.writeable = False
    assert _packing.packed_weights(lib, copy)[0] is not first and len(packs) == 4  # a new round's array
    key = id(copy)
    del copy
    gc.collect()
    assert key not in _packing._packed  # gone with its array


@needs_compiler
def test_a_dense_convolution_module_runs_without_the_library(tmp_path, monkeypatch):
    model, x = _conv_model(*SHAPES[2])
    module = build(_Package(load_model(model)), NATIVE, cache_dir=tmp_path)
    with_library = module.run({"x": x})["y"]
    monkeypatch.setitem(_native._state, "lib", None)  # as CUVIL_EDGE_NATIVE=0 or a failed compile leaves it
    np.testing.assert_allclose(module.run({"x": x})["y"], with_library, rtol=1e-5, atol=1e-5)


# --- one decision, three readers ------------------------------------------------------------------
KIND = {"native depthwise": "conv depthwise native", "native gemm": "conv native gemm", "1x1 matmul": "conv 1x1 gemm",
        "depthwise taps": "conv depthwise taps", "im2col blocks": "conv im2col blocks", "im2col": "conv im2col",
        "per-tap gemm": "conv per-tap gemm"}

# (batch, channels, spatial, outputs, kernel, group, pads)
PATH_GRID = [
    (1, 8, (12, 12), 8, (3, 3), 8, 1),  # depthwise
    (2, 6, (10, 10), 12, (3, 3), 1, 1),  # dense 3x3, small im2col
    (1, 64, (56, 56), 64, (3, 3), 1, 1),  # dense 3x3, an im2col over 2 MiB
    (1, 8, (9, 9), 16, (1, 1), 1, 0),  # 1x1
    (1, 8, (9, 9), 16, (1, 1), 1, 1),  # padded 1x1
    (1, 8, (9, 9), 16, (3, 3), 2, 1),  # grouped
    (1, 4, (20,), 6, (3,), 1, 1),  # 1-D
    (1, 4, (6, 6, 6), 5, (3, 3, 3), 1, 1),  # 3-D
]


def _recorder(monkeypatch, module):
    """The paths ``module``'s calls of conv_path return, in order."""
    seen, original = [], module.conv_path
    monkeypatch.setattr(module, "conv_path", lambda *args: seen.append(original(*args)) or seen[-1])
    return seen


@needs_compiler
@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("target", ["x86-64", "rpi4"])  # large scratch, and not
@pytest.mark.parametrize("case", PATH_GRID, ids=str)
def test_kernel_memory_plan_and_cost_model_take_the_same_path(monkeypatch, case, target, native):
    n, c, spatial, m, kernel, group, pad = case
    native = native and _native.library() is not None  # CUVIL_EDGE_NATIVE=0: the kernel cannot take C paths
    spec = load_target(target).model_copy(update={"native_kernels": native})
    rank = len(kernel)
    w = np.full((m, c // group) + kernel, 0.1, np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group, pads=[pad] * 2 * rank)
    graph = load_model(helper.make_model(helper.make_graph(
        [node], "paths", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, *spatial])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * (rank + 2))], [numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    kernel_paths, plan_paths = _recorder(monkeypatch, conv), _recorder(monkeypatch, _scratch)
    monkeypatch.setattr(conv, "TARGET_NATIVE", native)
    monkeypatch.setattr(conv, "TARGET_LARGE_SCRATCH", bool(spec.capabilities()["TARGET_LARGE_SCRATCH"]))
    x = np.ones((n, c, *spatial), np.float32)
    conv.k_conv(x, w, strides=(1,) * rank, pads=(pad,) * 2 * rank, dilations=(1,) * rank, auto_pad="NOTSET",
                  group=group)
    memory_plan.plan_memory(graph, spec, native=native)
    cost_kind = predict(graph, spec).nodes[0].kernel
    assert len(kernel_paths) == 1 and plan_paths and set(plan_paths) == set(kernel_paths)  # predict plans again
    assert cost_kind == KIND[kernel_paths[0]]
    if native and rank == 2 and group in (1, c):  # dense or depthwise: a C kernel
        assert kernel_paths[0].startswith("native")
