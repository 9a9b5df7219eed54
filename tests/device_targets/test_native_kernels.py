"""The native kernel path: C kernels compiled on the device, kept or pruned by the
``TARGET_NATIVE`` capability, equal to onnxruntime and to the numpy path they replace, and never
required: a missing or damaged library falls back to numpy."""

from __future__ import annotations

import math
import os
import re
import shutil
import stat
import subprocess
import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge import private_dir
from cuvil_edge.device_targets import build
from cuvil_edge.device_targets.spec import list_targets
from cuvil_edge.errors import UnsafePathError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.ops import _native
from cuvil_edge.passes import optimize

from native_targets import NATIVE, NUMPY, needs_compiler
from native_targets import Package as _Package



def _model(nodes, inputs, initializers=(), opset=17, output="y"):
    graph = helper.make_graph(nodes, "native", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                                 for n, s in inputs],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, [None] * len(inputs[0][1]))],
                              [numpy_helper.from_array(a, n) for n, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _run_three_ways(tmp_path, model, feeds, fuse=False):
    """(native compiled, numpy compiled, onnxruntime) outputs of ``model``."""
    graph = load_model(model)
    if fuse:
        graph, _ = optimize(graph)
    native = build(_Package(graph), NATIVE, cache_dir=tmp_path)
    numpy_only = build(_Package(graph), NUMPY, cache_dir=tmp_path)
    assert native.key != numpy_only.key
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return native.run(feeds)["y"], numpy_only.run(feeds)["y"], want, native.source, numpy_only.source


def test_the_capability_keeps_or_prunes_the_native_path(tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((4, 1, 3, 3)).astype(np.float32)
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1])],
                   [("x", [1, 4, 9, 9])], [("w", w)])
    *_, native_source, numpy_source = _run_three_ways(tmp_path, model, {"x": x})
    assert "cuvil_depthwise_conv2d_f32" in native_source and "_native_lib" in native_source
    assert not re.search(r"cuvil_\w+_f32", numpy_source) and "_native_lib" not in numpy_source and "TARGET_NATIVE" not in numpy_source
    ascend = build(_Package(load_model(model)), "ascend-310", cache_dir=tmp_path)
    assert "_native_lib" not in ascend.source  # a spec without native_kernels: numpy only


@needs_compiler
def test_the_library_builds_here():
    assert _native.library() is not None, "a C compiler is on PATH but native_kernels.c did not build; see the log"


DEPTHWISE = [  # (channels, size, kernel, strides, dilations, pads, auto_pad, bias, activation op)
    (8, 12, 3, (1, 1), (1, 1), (1, 1, 1, 1), "NOTSET", True, None),
    (6, 11, 3, (2, 2), (1, 1), (1, 1, 1, 1), "NOTSET", False, "Relu"),
    (5, 13, 5, (2, 1), (1, 1), (2, 1, 0, 2), "NOTSET", True, "Clip"),
    (4, 15, 3, (1, 1), (2, 2), (2, 2, 2, 2), "NOTSET", True, "HardSwish"),
    (3, 9, 7, (1, 1), (1, 1), (3, 3, 3, 3), "NOTSET", True, "Sigmoid"),
    (4, 10, 3, (2, 2), (1, 1), None, "SAME_UPPER", True, None),
    (4, 10, 4, (3, 3), (1, 1), None, "SAME_LOWER", False, "Relu"),
    (2, 6, 3, (1, 1), (1, 1), (0, 0, 0, 0), "VALID", True, None),
]


@needs_compiler
@pytest.mark.parametrize("case", DEPTHWISE, ids=[f"dw{i}" for i in range(len(DEPTHWISE))])
def test_depthwise_convolution_matches_onnxruntime_and_the_numpy_path(tmp_path, case):
    c, size, k, strides, dilations, pads, auto_pad, bias, act = case
    rng = np.random.default_rng(c * size)
    x = rng.standard_normal((3, c, size, size + 1)).astype(np.float32)
    inits = [("w", rng.standard_normal((c, 1, k, k)).astype(np.float32))]
    if bias:
        inits.append(("b", rng.standard_normal(c).astype(np.float32)))
    attrs = {"group": c, "strides": list(strides), "dilations": list(dilations), "auto_pad": auto_pad}
    if pads is not None and auto_pad == "NOTSET":
        attrs["pads"] = list(pads)
    conv_out = "y" if act is None else "t"
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), [conv_out], **attrs)]
    if act == "Clip":
        inits += [("lo", np.array(0, np.float32)), ("hi", np.array(6, np.float32))]
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    elif act is not None:
        nodes.append(helper.make_node(act, ["t"], ["y"]))
    model = _model(nodes, [("x", [3, c, size, size + 1])], inits)
    native, numpy_only, want, source, _ = _run_three_ways(tmp_path, model, {"x": x}, fuse=True)
    assert "cuvil_depthwise_conv2d_f32" in source
    np.testing.assert_allclose(native, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(native, numpy_only, rtol=1e-5, atol=1e-5)


POOLS = [  # (kernel, strides, dilations, pads, ceil_mode)
    ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 0),
    ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 1),
    ((3, 2), (1, 2), (2, 1), (2, 0, 1, 1), 0),
    ((3, 3), (3, 3), (1, 1), (1, 1, 1, 1), 1),
]


@needs_compiler
@pytest.mark.parametrize("case", POOLS, ids=[f"pool{i}" for i in range(len(POOLS))])
def test_max_pooling_matches_onnxruntime_and_the_numpy_path(tmp_path, case):
    kernel, strides, dilations, pads, ceil_mode = case
    x = np.random.default_rng(7).standard_normal((2, 3, 11, 10)).astype(np.float32)
    x[0, 0, 0, 0] = np.inf
    x[1, 2, 5, 5] = -np.inf
    model = _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=list(kernel), strides=list(strides),
                                     dilations=list(dilations), pads=list(pads), ceil_mode=ceil_mode)],
                   [("x", [2, 3, 11, 10])])
    native, numpy_only, want, source, _ = _run_three_ways(tmp_path, model, {"x": x})
    assert "cuvil_max_pool2d_f32" in source
    np.testing.assert_array_equal(native, want)
    np.testing.assert_array_equal(native, numpy_only)


@needs_compiler
def test_max_pooling_propagates_nan_like_the_numpy_path(tmp_path):
    x = np.random.default_rng(8).standard_normal((1, 1, 6, 6)).astype(np.float32)
    x[0, 0, 2, 3] = np.nan
    model = _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1])],
                   [("x", [1, 1, 6, 6])])
    native, numpy_only, *_ = _run_three_ways(tmp_path, model, {"x": x})
    np.testing.assert_array_equal(np.isnan(native), np.isnan(numpy_only))
    assert np.isnan(native).sum() == 9
    np.testing.assert_array_equal(native[~np.isnan(native)], numpy_only[~np.isnan(numpy_only)])


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-8, 40.0, -40.0, 3.9, -3.9, 0.5, -0.5,
                    0.46875, -5.5, 88.0, -88.0, 104.0, -104.0], np.float32)


def _exact(op, x):
    """float64 values from Python's math (erf/erfc are accurate to an ulp of a double)."""
    def one(v):
        if math.isnan(v):
            return math.nan
        if op == "Erf":
            return math.erf(v)
        if op == "Gelu":  # 0.5 x erfc(-x / sqrt 2): no cancellation for x << 0
            return 0.5 * v * math.erfc(-v / math.sqrt(2)) if math.isfinite(v) else (v if v > 0 else math.nan)
        return 1 / (1 + math.exp(-v)) if v > -700 else 0.0
    return np.vectorize(one, otypes=[np.float64])(x.astype(np.float64))


@needs_compiler
@pytest.mark.parametrize("op", ["Erf", "Sigmoid", "Gelu"])
def test_transcendental_kernels_match_exact_values_onnxruntime_and_the_numpy_path(tmp_path, op):
    rng = np.random.default_rng(3)
    x = np.concatenate([SPECIAL, (rng.standard_normal(20000) * 4).astype(np.float32)]).reshape(4, -1)
    x = np.ascontiguousarray(x.T).T  # a non-contiguous input: the kernel copies it once
    model = _model([helper.make_node(op, ["x"], ["y"])], [("x", list(x.shape))], opset=20 if op == "Gelu" else 17)
    native, numpy_only, want, source, _ = _run_three_ways(tmp_path, model, {"x": x})
    assert f"cuvil_{op.lower()}_f32" in source
    np.testing.assert_array_equal(np.isnan(native), np.isnan(numpy_only))  # gelu(-inf) = -inf * 0 in both
    exact = _exact(op, x)
    # a few float32 ulps; libmvec's erfcf drifts to ~1e-5 relative where gelu(x) < 1e-20 (x < -9.5)
    rtol = 2e-5 if op == "Gelu" else 5e-6
    np.testing.assert_allclose(native, exact, rtol=rtol, atol=1e-37)
    # the numpy path rounds 1 + erf in float64, which cancels for x << 0 (gelu(-8) ~ -5e-15): compare absolutely
    np.testing.assert_allclose(native, numpy_only, rtol=rtol, atol=1e-12)
    # onnxruntime's own Sigmoid is an approximation good to ~5e-4 relative at its small values
    np.testing.assert_allclose(native, want, rtol=1e-3 if op == "Sigmoid" else 2e-6, atol=1e-7)


@needs_compiler
def test_gelu_is_accurate_where_one_plus_erf_cancels(tmp_path):
    x = -np.linspace(3, 12, 901, dtype=np.float32).reshape(1, -1)
    model = _model([helper.make_node("Gelu", ["x"], ["y"])], [("x", list(x.shape))], opset=20)
    native, *_ = _run_three_ways(tmp_path, model, {"x": x})
    np.testing.assert_allclose(native, _exact("Gelu", x), rtol=2e-5)  # relative, down to gelu(-12) ~ -1e-32


def test_a_module_built_with_the_capability_runs_without_the_library(tmp_path, monkeypatch):
    """The library can vanish after the build (cache wiped, no compiler): the numpy path runs."""
    x = np.random.default_rng(4).standard_normal((2, 6, 10, 10)).astype(np.float32)
    w = np.random.default_rng(5).standard_normal((6, 1, 3, 3)).astype(np.float32)
    model = _model([helper.make_node("Conv", ["x", "w"], ["t"], group=6, pads=[1, 1, 1, 1]),
                    helper.make_node("Erf", ["t"], ["u"]),
                    helper.make_node("MaxPool", ["u"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                   [("x", [2, 6, 10, 10])], [("w", w)])
    graph = load_model(model)
    compiled = build(_Package(graph), NATIVE, cache_dir=tmp_path)
    monkeypatch.setitem(_native._state, "lib", None)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], interpreter.run(graph, {"x": x})["y"], rtol=1e-6,
                               atol=1e-7)


@needs_compiler
@pytest.mark.parametrize("target", list_targets())
def test_a_build_writes_the_same_module_with_or_without_the_library(tmp_path, monkeypatch, target):
    """The library decides which kernel calls run, not what the build writes: a module built where it
    loaded and one built where it did not are the same entry (key and source). tests/conftest.py's
    numpy rerun relies on this to run the first run's build again with the library withheld."""
    rng = np.random.default_rng(6)
    model = _model([helper.make_node("Conv", ["x", "dw"], ["a"], group=8, pads=[1, 1, 1, 1]),
                    helper.make_node("Conv", ["a", "pw"], ["b"]),
                    helper.make_node("Erf", ["b"], ["c"]),
                    helper.make_node("MaxPool", ["c"], ["d"], kernel_shape=[2, 2], strides=[2, 2]),
                    helper.make_node("Softmax", ["d"], ["y"], axis=-1)],
                   [("x", ["batch", 8, 12, 12])],
                   [("dw", rng.standard_normal((8, 1, 3, 3)).astype(np.float32)),
                    ("pw", rng.standard_normal((16, 8, 1, 1)).astype(np.float32))])
    graph, _ = optimize(load_model(model))
    assert _native.library() is not None
    loaded = build(_Package(graph), target, cache_dir=tmp_path / "loaded")
    monkeypatch.setitem(_native._state, "lib", None)
    withheld = build(_Package(graph), target, cache_dir=tmp_path / "withheld")
    assert (withheld.key, withheld.source) == (loaded.key, loaded.source)


def test_the_environment_switch_turns_the_library_off(monkeypatch):
    monkeypatch.setenv("CUVIL_EDGE_NATIVE", "0")
    assert _native._load() is None


def test_no_compiler_means_no_library(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    assert _native._compiler() is None and _native._load() is None


@needs_compiler
def test_a_damaged_cached_library_is_compiled_again(first_use, monkeypatch, tmp_path):
    _, path = _built_cache(first_use, tmp_path, monkeypatch)
    path.write_bytes(b"\x7fELF not really a shared object")
    lib = _native._load()
    assert lib is not None and lib.cuvil_abi_version() == _native.ABI_VERSION
    assert path.read_bytes()[:4] == b"\x7fELF" and path.stat().st_size > 1000


@needs_compiler
def test_concurrent_first_uses_compile_without_corrupting_the_cache(tmp_path):
    """Four processes' worth of first uses at once (threads here): each compile writes a private
    temporary file and renames it, so every caller gets a complete library."""
    paths, errors = [], []

    def first_use():
        try:
            paths.append(_native._library_bytes(_native._compiler(), tmp_path)[0])
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(paths)) == 1
    name = paths[0].name  # no temporary file left behind: the library, its MAC and the cache's key
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, name + _native.MAC_SUFFIX, _native.KEY_FILE]
    assert paths[0].read_bytes()[:4] == b"\x7fELF"


LAYER_NORMS = [  # (shape, axis, bias, scale shape)
    ((2, 7, 33), -1, True, (33,)),
    ((3, 5, 6, 8), -2, False, (6, 8)),
    ((4, 10), 0, True, (4, 10)),
    ((1, 9, 9, 64), 3, True, (64,)),
]


@needs_compiler
@pytest.mark.parametrize("case", LAYER_NORMS, ids=[f"ln{i}" for i in range(len(LAYER_NORMS))])
def test_layer_normalization_matches_onnxruntime_and_the_numpy_path(tmp_path, case):
    shape, axis, bias, scale_shape = case
    rng = np.random.default_rng(len(shape) + axis)
    x = (rng.standard_normal(shape) * 5 + 3).astype(np.float32)
    inits = [("s", rng.standard_normal(scale_shape).astype(np.float32))]
    if bias:
        inits.append(("b", rng.standard_normal(scale_shape).astype(np.float32)))
    model = _model([helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if bias else []), ["y"], axis=axis,
                                     epsilon=1e-3)], [("x", list(shape))], inits)
    native, numpy_only, want, source, _ = _run_three_ways(tmp_path, model, {"x": x})
    assert "cuvil_layer_norm_f32" in source
    np.testing.assert_allclose(native, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(native, numpy_only, rtol=1e-5, atol=2e-5)


@needs_compiler
def test_layer_normalization_with_statistics_outputs_takes_the_numpy_path(tmp_path):
    x = np.random.default_rng(9).standard_normal((3, 16)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"])], "ln",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, None]) for n in ("y", "mean", "inv")],
                              [numpy_helper.from_array(np.ones(16, np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    got = build(_Package(load_model(model)), NATIVE, cache_dir=tmp_path).run({"x": x})
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for name, expected in zip(("y", "mean", "inv"), want):
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6)


EPILOGUES = ["none", "Relu", "Clip", "Sigmoid", "SiLU", "Gelu", "HardSwish"]


def _activation_nodes(act, inits):
    """Nodes turning the conv's output t into y with ``act`` (SiLU as torch writes it)."""
    if act == "none":
        return [helper.make_node("Identity", ["t"], ["y"])]
    if act == "Clip":
        inits += [("lo", np.array(0, np.float32)), ("hi", np.array(6, np.float32))]
        return [helper.make_node("Clip", ["t", "lo", "hi"], ["y"])]
    if act == "SiLU":
        return [helper.make_node("Sigmoid", ["t"], ["g"]), helper.make_node("Mul", ["t", "g"], ["y"])]
    if act == "Gelu":  # torch's erf export before opset 20
        inits += [("r2", np.array(np.sqrt(2), np.float32)), ("one", np.array(1, np.float32)),
                  ("half", np.array(0.5, np.float32))]
        return [helper.make_node("Div", ["t", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["t", "a"], ["m"]),
                helper.make_node("Mul", ["m", "half"], ["y"])]
    return [helper.make_node(act, ["t"], ["y"])]


class _Spy:
    """The native library, recording which of its functions were called."""

    def __init__(self, lib):
        self.lib, self.called = lib, set()

    def __getattr__(self, name):
        self.called.add(name)
        return getattr(self.lib, name)


@needs_compiler
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("act", EPILOGUES)
def test_the_fused_epilogue_matches_onnxruntime_and_the_numpy_path(tmp_path, monkeypatch, kernel, act):
    """A dense convolution runs in the native GEMM, its bias and a fused Relu/Clip(0, 6) in the
    GEMM's store; a transcendental activation in one native pass over its output."""
    rng = np.random.default_rng(kernel * 10 + len(act))
    x = rng.standard_normal((2, 5, 50, 50)).astype(np.float32)  # 35,000 outputs: over the native epilogue's floor
    inits = [("w", rng.standard_normal((7, 5, kernel, kernel)).astype(np.float32)),
             ("b", rng.standard_normal(7).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[kernel // 2] * 4)] + _activation_nodes(act, inits)
    model = _model(nodes, [("x", [2, 5, 50, 50])], inits)
    spy = _Spy(_native.library())
    monkeypatch.setitem(_native._state, "lib", spy)
    native, numpy_only, want, source, _ = _run_three_ways(tmp_path, model, {"x": x}, fuse=True)
    assert "cuvil_conv_gemm_f32" in spy.called
    assert ("cuvil_epilogue_f32" in spy.called) == (act in ("Sigmoid", "SiLU", "Gelu"))  # the others: in the store
    if act in ("SiLU", "Gelu"):
        assert "Sigmoid" not in source and "k_erf" not in source  # fused into the convolution
    np.testing.assert_allclose(native, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(native, numpy_only, rtol=1e-5, atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_swish_matches_its_formula(tmp_path, alpha):
    x = np.concatenate([SPECIAL, np.random.default_rng(2).standard_normal(5000).astype(np.float32) * 6])[None]
    model = _model([helper.make_node("Swish", ["x"], ["y"], alpha=alpha)], [("x", list(x.shape))], opset=24)
    graph = load_model(model)
    native = build(_Package(graph), NATIVE, cache_dir=tmp_path)
    numpy_only = build(_Package(graph), NUMPY, cache_dir=tmp_path)
    assert "cuvil_swish_f32" in native.source
    got, ref = native.run({"x": x})["y"], numpy_only.run({"x": x})["y"]
    exact = np.vectorize(lambda v: v / (1 + math.exp(-alpha * v)) if -alpha * v < 700 else -0.0 * v,
                         otypes=[np.float64])(x.astype(np.float64))
    finite = np.isfinite(exact)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got[finite], exact[finite], rtol=5e-6, atol=1e-37)
    np.testing.assert_allclose(got, ref, rtol=5e-6, atol=1e-30)


SOFTMAXES = [((3, 4, 50), -1, 13), ((2, 8, 16, 16), 3, 13), ((4, 3, 5), 1, 11), ((6, 20), -1, 11)]


@needs_compiler
@pytest.mark.parametrize("case", SOFTMAXES, ids=[f"softmax{i}" for i in range(len(SOFTMAXES))])
def test_softmax_matches_onnxruntime_and_the_numpy_path(tmp_path, monkeypatch, case):
    shape, axis, opset = case
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 10).astype(np.float32)
    x.reshape(-1)[:3] = [80.0, -80.0, 0.0]  # exp(80 - max) would overflow without the shift
    spy = _Spy(_native.library())
    monkeypatch.setitem(_native._state, "lib", spy)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [("x", list(shape))], opset=opset)
    native, numpy_only, want, source, _ = _run_three_ways(tmp_path, model, {"x": x})
    assert "cuvil_softmax_f32" in spy.called
    np.testing.assert_allclose(native, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(native, numpy_only, rtol=2e-6, atol=1e-7)


@needs_compiler
def test_softmax_over_an_inner_axis_takes_the_numpy_path(tmp_path, monkeypatch):
    x = np.random.default_rng(5).standard_normal((2, 7, 5)).astype(np.float32)
    spy = _Spy(_native.library())
    monkeypatch.setitem(_native._state, "lib", spy)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", [2, 7, 5])], opset=13)
    native, numpy_only, want, *_ = _run_three_ways(tmp_path, model, {"x": x})
    assert "cuvil_softmax_f32" not in spy.called
    np.testing.assert_allclose(native, want, rtol=2e-6, atol=1e-7)


# --- attacks on the native-library cache: one named test each ----------------------
def _plant(path, marker, tmp_path):
    """Compile, with this machine's compiler, a library whose constructor writes ``marker`` the
    moment it is loaded (and which answers the ABI probe), and put it at ``path``."""
    source = tmp_path / "planted.c"
    source.write_text(f'#include <stdio.h>\n#include <stdint.h>\n'
                      f'__attribute__((constructor)) static void planted(void) {{\n'
                      f'    FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("planted", f); fclose(f); }}\n}}\n'
                      f'int64_t cuvil_abi_version(void) {{ return {_native.ABI_VERSION}; }}\n')
    subprocess.run([_native._compiler(), "-shared", "-fPIC", "-o", str(path), str(source)], check=True)


@pytest.fixture(scope="session")
def first_use(tmp_path_factory):
    """The cache a first use leaves: the library compiled by a real first use in another process
    (so nothing from it is loaded in this one), once per pytest process. The tests that start from
    a built cache take a copy of it (:func:`_first_use_in_another_process`) rather than each paying
    a compile of its own (over a second of CPU); those whose point is a compile still compile."""
    cache = tmp_path_factory.mktemp("native-first-use") / "cache"
    env = {**os.environ, "CUVIL_EDGE_NATIVE_CACHE": str(cache)}
    subprocess.run([sys.executable, "-c", "from cuvil_edge.ir.ops import _native; assert _native._load()"], env=env,
                   check=True, timeout=300)
    return cache


def _entries(cache):
    """The folder ``cache`` and each entry in it, by name ("" for the folder): (mode, with the file
    type; owner; bytes of a file)."""
    def one(path):
        st = os.lstat(path)
        return st.st_mode, st.st_uid, None if stat.S_ISDIR(st.st_mode) else path.read_bytes()
    return {"": one(cache), **{p.name: one(p) for p in cache.iterdir()}}


def _first_use_in_another_process(first_use, cache):
    """What an earlier run of the agent leaves: the library compiled into ``cache`` by a first use
    in another process (and, in this process, nothing loaded from there); its name. A copy of
    ``first_use`` (the fixture): the same bytes, modes and owner, so exactly what that first use
    left, and its MAC verifies (the MAC covers the library's name and bytes, the key is copied)."""
    shutil.copytree(first_use, cache, copy_function=shutil.copy2)
    # the folder's mode (0700) is the loader's first check: copied in so many words, not left to
    # copytree, which makes the folder under the umask and copies its mode only at the end
    shutil.copymode(first_use, cache)
    assert _entries(cache) == _entries(first_use)
    [library] = cache.glob("kernels-*.so")
    return library.name


def _assert_native_kernels_work(lib):
    x = np.linspace(-6, 6, 101, dtype=np.float32)
    y = np.empty_like(x)
    lib.cuvil_sigmoid_f32(x.ctypes.data, y.ctypes.data, x.size)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


@needs_compiler
@pytest.mark.parametrize("when", ["before first use", "over the built library", "with a MAC under another key"])
def test_planted_native_library_is_not_loaded(first_use, tmp_path, monkeypatch, when):
    """A library planted under the name the loader computes (with the real one's MAC file beside it,
    or a MAC of the attacker's own key): its MAC does not verify, so it is compiled again; the
    planted constructor never runs, and the kernels work."""
    cache, marker = tmp_path / "cache", tmp_path / "constructor-ran"
    if when == "before first use":  # the name is computable from public inputs: here, from another cache's
        name = _first_use_in_another_process(first_use, tmp_path / "other")
        cache.mkdir()
    else:
        name = _first_use_in_another_process(first_use, cache)
    _plant(cache / name, marker, tmp_path)
    planted = (cache / name).read_bytes()
    if when == "with a MAC under another key":
        (cache / (name + ".hmac")).write_text(private_dir.mac(os.urandom(32), planted).hex() + "\n")
    monkeypatch.setenv("CUVIL_EDGE_NATIVE_CACHE", str(cache))
    try:
        lib = _native._load()
    finally:
        assert not marker.exists(), "the planted library's constructor ran in this process"
    assert lib is not None and lib.cuvil_abi_version() == _native.ABI_VERSION
    _assert_native_kernels_work(lib)
    assert (cache / name).read_bytes() != planted  # the entry was rebuilt
    assert _native._library_bytes(_native._compiler(), cache)[1] == (cache / name).read_bytes()  # and verifies


def _built_cache(first_use, tmp_path, monkeypatch):
    """A cache holding this machine's library, left by a first use (a copy of ``first_use``, see
    :func:`_first_use_in_another_process`) and set as this test's; (the cache, the library)."""
    cache = tmp_path / "cache"
    library = cache / _first_use_in_another_process(first_use, cache)
    monkeypatch.setenv("CUVIL_EDGE_NATIVE_CACHE", str(cache))
    return cache, library


@needs_compiler
def test_a_copied_first_use_is_loaded_as_it_is(first_use, tmp_path, monkeypatch):
    """What the tests that start from a copy of a first use's cache rely on: the copy verifies, so
    the loader loads its library without compiling or rewriting anything."""
    cache, library = _built_cache(first_use, tmp_path, monkeypatch)
    files = {p.name: (os.lstat(p).st_ino, os.lstat(p).st_mtime_ns) for p in cache.iterdir()}
    monkeypatch.setattr(_native, "_build", lambda *args: pytest.fail("the copied library was compiled again"))
    lib = _native._load()
    assert lib is not None and lib.cuvil_abi_version() == _native.ABI_VERSION
    _assert_native_kernels_work(lib)
    assert {p.name: (os.lstat(p).st_ino, os.lstat(p).st_mtime_ns) for p in cache.iterdir()} == files
    assert _entries(cache) == _entries(first_use)


#: what is opened up -> (where, mode, what the message says to run)
OPENED = {"cache folder": (lambda cache, lib: cache, 0o777, "chmod 700"),
          "cache folder, group-writable": (lambda cache, lib: cache, 0o770, "chmod 700"),
          "library": (lambda cache, lib: lib, 0o666, "chmod 600"),
          "library MAC": (lambda cache, lib: lib.with_name(lib.name + _native.MAC_SUFFIX), 0o622, "chmod 600"),
          "MAC key readable by others": (lambda cache, lib: cache / _native.KEY_FILE, 0o604, "chmod 600")}


@needs_compiler
@pytest.mark.parametrize("case", list(OPENED))
def test_group_writable_native_cache_is_refused(first_use, tmp_path, monkeypatch, case):
    where, mode, fix = OPENED[case]
    cache, library = _built_cache(first_use, tmp_path, monkeypatch)
    path = where(cache, library)
    os.chmod(path, mode)
    named = re.escape(str(path))
    with pytest.raises(UnsafePathError, match=f"{named}.*group or others.*{fix} {named}.*CUVIL_EDGE_NATIVE=0"):
        _native._load()
    monkeypatch.setattr(_native, "_state", {})
    with pytest.raises(UnsafePathError):  # what kernels call: refused there too, and not remembered as "no library"
        _native.library()
    assert "lib" not in _native._state


@needs_compiler
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("case", ["cache folder", "library", "library MAC"])
def test_foreign_owned_native_cache_entry_is_refused(first_use, tmp_path, monkeypatch, case):
    where, *_ = OPENED[case]
    cache, library = _built_cache(first_use, tmp_path, monkeypatch)
    path = where(cache, library)
    os.chown(path, 12345, -1)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(path))} is owned by uid 12345"):
        _native._load()


@needs_compiler
@pytest.mark.parametrize("case", ["cache folder", "library"])
def test_symlinked_native_cache_entry_is_refused(first_use, tmp_path, monkeypatch, case):
    """A link to a genuine copy (whose bytes and MAC would pass): refused, not followed."""
    where, *_ = OPENED[case]
    cache, library = _built_cache(first_use, tmp_path, monkeypatch)
    path = where(cache, library)
    copy = tmp_path / "elsewhere"
    path.rename(copy)
    path.symlink_to(copy)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(path))} is a symbolic link"):
        _native._load()


@needs_compiler
def test_a_new_native_cache_is_private(tmp_path, monkeypatch):
    cache = tmp_path / "made" / "native"
    monkeypatch.setenv("CUVIL_EDGE_NATIVE_CACHE", str(cache))
    _native._load()
    files = {p.name: stat.S_IMODE(os.lstat(p).st_mode) for p in cache.iterdir()}
    assert stat.S_IMODE(os.lstat(cache).st_mode) == stat.S_IMODE(os.lstat(cache.parent).st_mode) == 0o700
    assert files == {_native.KEY_FILE: 0o600, **{p.name: 0o600 for p in cache.glob("kernels-*")}} and len(files) == 3
