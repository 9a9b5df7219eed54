"""FuseDepthwisePointwise: a stride-1 depthwise conv feeding only a 1x1 conv (and its residual Add)
becomes one CuvilDwPw whose outputs match the two convolutions (interpreter, compiled with and
without the native library, onnxruntime); nothing that only resembles the block is fused."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from pass_helpers import assert_same_outputs, graph_from_text, op_types, w

from cuvil_edge.device_targets import build
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.ops import _native, fused_block
from cuvil_edge.passes import (
    FuseConvAdd,
    FuseDepthwisePointwise,
    default_passes,
    fuse_dw_pw,
    optimize,
)
from cuvil_edge.passes.fuse_dw_pw import split_dw_pw

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compiled_models


@pytest.fixture(autouse=True)
def _any_width(monkeypatch, request):
    """The small graphs here are narrower than the pass's MIN_WIDTH: every map is fused in these
    tests except the one that checks the default."""
    if "default_width" not in request.node.name:
        monkeypatch.setattr(fuse_dw_pw, "MIN_WIDTH", 1)


class _Payload:
    def __init__(self, graph):
        self.graph, self.payload_digest = graph, "ab" * 32


def _block(dw_attrs: str = "group = 8, pads = [1, 1, 1, 1]", dw_w=(8, 1, 3, 3), pw_w=(6, 8, 1, 1), tail: str = "",
           out: str = "y", extra_out: str = "", act: str = "a = Clip(d, lo, hi)", spatial=(9, 7), in_spatial=None,
           pw_attrs: str = "", residual: bool = True) -> str:
    h, wd = spatial
    ih, iw = in_spatial or spatial
    r = f", float[N, 6, {h}, {wd}] r" if residual else ""
    return f"""
g (float[N, 8, {ih}, {iw}] x{r}) => (float[N, 6, {h}, {wd}] {out}{extra_out}) {{
    d = Conv <{dw_attrs}> (x, wd, bd)
    {act}
    p = Conv {pw_attrs} (a, wp, bp)
    {tail}
}}"""


def _weights(dw_w=(8, 1, 3, 3), pw_w=(6, 8, 1, 1)):
    return {"wd": w(*dw_w), "bd": w(dw_w[0]), "wp": w(*pw_w), "bp": w(pw_w[0]),
            "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}


def _unfused(graph):
    """The pipeline without the block fusions (FuseConvAdd would take the pointwise conv's Add)."""
    fusions = (FuseDepthwisePointwise, FuseConvAdd)
    return optimize(graph, [p for p in default_passes() if not isinstance(p, fusions)])[0]


def _compiled(graph, tmp_path, feeds):
    return build(_Payload(graph), "x86-64", cache_dir=tmp_path).run(feeds)


@pytest.mark.parametrize("tail, fused_inputs", [("y = Add(p, r)", 6), ("y = Add(r, p)", 6), ("y = Relu(p)", 5)])
def test_the_block_becomes_one_node_with_the_same_outputs(tail, fused_inputs):
    before = graph_from_text(_block(tail=tail), **_weights())
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilDwPw"] and len(after.nodes[0].inputs) == fused_inputs
    assert after.nodes[0].attr("dw_activation") == "relu6"
    assert after.nodes[0].attr("pw_activation") == ("relu" if "Relu" in tail else "none")
    assert_same_outputs(before, after, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strides, spatial", [((2, 2), (5, 4)), ((2, 1), (5, 7)), ((3, 2), (3, 4))])
def test_a_strided_block_equals_its_two_convolutions(strides, spatial, tmp_path, monkeypatch):
    # the pipeline leaves strided blocks to the two kernels (faster there), so fuse by hand
    monkeypatch.setattr(fuse_dw_pw, "STRIDES", (strides,))
    text = _block(f"group = 8, pads = [1, 1, 1, 1], strides = [{strides[0]}, {strides[1]}]", tail="y = Relu(p)",
                  spatial=spatial, in_spatial=(9, 7), residual=False)
    before = graph_from_text(text, **_weights())
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilDwPw"] and after.nodes[0].attr("strides") == list(strides)
    assert_same_outputs(before, after)
    x = np.random.default_rng(7).standard_normal((2, 8, 9, 7)).astype(np.float32)
    got = build(_Payload(after), "x86-64", cache_dir=tmp_path).run({"x": x})["y"]
    np.testing.assert_allclose(got, interpreter.run(before, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_without_biases_and_with_dilation_and_a_5x5_kernel():
    text = _block("group = 8, pads = [4, 2, 4, 2], dilations = [2, 1]", dw_w=(8, 1, 5, 5), tail="y = Add(p, r)",
                  act="a = Relu(d)").replace("(x, wd, bd)", "(x, wd)").replace("(a, wp, bp)", "(a, wp)")
    before = graph_from_text(text, **{k: v for k, v in _weights(dw_w=(8, 1, 5, 5)).items() if k in ("wd", "wp")})
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilDwPw"]
    assert_same_outputs(before, after)


@pytest.mark.parametrize("target", ["x86-64", "ascend-310"])
def test_compiled_without_biases_or_residual(target, tmp_path):
    text = _block(tail="y = Relu(p)").replace("(x, wd, bd)", "(x, wd)").replace("(a, wp, bp)", "(a, wp)")
    before = graph_from_text(text, **{k: v for k, v in _weights().items() if k not in ("bd", "bp")})
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilDwPw"] and len(after.nodes[0].inputs) == 4
    feeds = {"x": np.random.default_rng(5).standard_normal((3, 8, 9, 7)).astype(np.float32),
             "r": np.zeros((3, 6, 9, 7), np.float32)}
    got = build(_Payload(after), target, cache_dir=tmp_path).run(feeds)["y"]
    np.testing.assert_allclose(got, interpreter.run(before, feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("native", ["1", "0"])
def test_compiled_native_and_numpy_paths_match_the_interpreter(native, tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_EDGE_NATIVE", native)
    monkeypatch.setattr(_native, "_state", {})  # the library is loaded (or not) again under this setting
    before = graph_from_text(_block(tail="y = Add(p, r)", spatial=(31, 29)), **_weights())
    after, _ = optimize(before)
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 8, 31, 29)).astype(np.float32),
             "r": np.random.default_rng(4).standard_normal((2, 6, 31, 29)).astype(np.float32)}
    model = build(_Payload(after), "x86-64", cache_dir=tmp_path)
    assert ("cuvil_dwpw_f32" in model.source) and (_native.library() is None) == (native == "0")
    np.testing.assert_allclose(model.run(feeds)["y"], interpreter.run(before, feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 96, 24, 14, 14), (2, 7, 5, 9, 11), (1, 960, 320, 7, 7), (1, 16, 9, 3, 1),
                                   (1, 24, 48, 57, 3)])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_native_kernel_equals_the_numpy_kernel(shape, stride, monkeypatch):
    monkeypatch.setenv("CUVIL_EDGE_NATIVE", "1")  # the C library itself, even where modules are kept off it
    lib = _native._load()
    assert lib is not None, "the native library did not build on this machine"
    n, c, m, h, wd = shape
    rng = np.random.default_rng(c)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    wdw, bdw = rng.standard_normal((c, 1, 3, 3)).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    wpw = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    wpw.flags.writeable = False  # as a package's weights: packed once, kept
    res = rng.standard_normal((n, m, (h - 1) // stride + 1, (wd - 1) // stride + 1)).astype(np.float32)
    attrs = {"strides": (stride, stride), "pads": (1, 1, 1, 1), "dilations": (1, 1), "dw_activation": "relu6",
             "pw_activation": "relu"}
    want = fused_block.k_dw_pw(x, wdw, bdw, wpw, None, res, **attrs)
    for _ in range(2):  # the second call takes the packed weights from the table
        got = fused_block._dwpw_native(lib, x, wdw, bdw, wpw, None, res, *attrs.values())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_mobilenetv2_block_matches_onnxruntime(tmp_path):
    torch.manual_seed(0)
    model = compiled_models.randomise_statistics(compiled_models.InvertedResidual(24, 24, 1, 6)).eval()
    x = torch.randn(1, 24, 28, 28)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    before = load_model(buffer.getvalue())
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilFusedConv", "CuvilDwPw"] and len(after.nodes[1].inputs) == 6
    assert not FuseDepthwisePointwise()(after).modified  # a fixed point: nothing left to fuse
    want = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(interpreter.run(after, {"x": x.numpy()})["y"], want, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(_compiled(after, tmp_path, {"x": x.numpy()})["y"], want, rtol=0, atol=1e-5 * scale)


NOT_FUSED = {
    "stride-2 depthwise": {"dw_attrs": "group = 8, pads = [1, 1, 1, 1], strides = [2, 2]", "tail": "y = Relu(p)",
                           "spatial": (5, 4), "in_spatial": (9, 7), "residual": False},
    "grouped, not depthwise": {"dw_attrs": "group = 4, pads = [1, 1, 1, 1]", "dw_w": (8, 2, 3, 3), "tail": "y = Relu(p)"},
    "a strided pointwise conv": {"pw_attrs": "<strides = [2, 2]>", "tail": "y = Relu(p)", "spatial": (5, 4),
                                 "in_spatial": (9, 7), "residual": False},
    "SAME padding": {"dw_attrs": 'group = 8, auto_pad = "SAME_UPPER"', "tail": "y = Relu(p)"},
    "a transcendental depthwise activation": {"act": "a = Sigmoid(d)", "tail": "y = Relu(p)"},
    "the depthwise output read again": {"tail": "y = Relu(p)\n    z = Relu(a)", "extra_out": ", float[N, 8, 9, 7] z"},
    "the depthwise output is a graph output": {"act": "a = Relu(d)", "tail": "y = Relu(p)",
                                                   "extra_out": ", float[N, 8, 9, 7] a"},
}


@pytest.mark.parametrize("case", sorted(NOT_FUSED))
def test_what_only_resembles_the_block_is_not_fused(case):
    args = NOT_FUSED[case]
    before = graph_from_text(_block(**args), **_weights(dw_w=args.get("dw_w", (8, 1, 3, 3))))
    after, _ = optimize(before)
    assert "CuvilDwPw" not in op_types(after)
    assert_same_outputs(before, after)


def test_a_3x3_pointwise_and_a_broadcast_residual_are_not_taken():
    kxk = graph_from_text(_block(pw_w=(6, 8, 3, 3), tail="y = Relu(p)").replace(
        "Conv (a, wp, bp)", "Conv <pads = [1, 1, 1, 1]> (a, wp, bp)"), **_weights(pw_w=(6, 8, 3, 3)))
    assert "CuvilDwPw" not in op_types(optimize(kxk)[0])
    # a residual that broadcasts is left to its Add: the block is fused without it
    text = _block(tail="y = Add(p, rb)").replace("float[N, 6, 9, 7] r)", "float[N, 6, 1, 7] rb)")
    before = graph_from_text(text, **_weights())
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilDwPw", "Add"] and len(after.nodes[0].inputs) == 5
    assert_same_outputs(before, after)


def test_the_residual_computed_after_the_depthwise_conv_keeps_the_order():
    text = _block(tail="q = Relu(r)\n    y = Add(p, q)")
    before = graph_from_text(text, **_weights())
    after, _ = optimize(before)
    assert op_types(after) == ["Relu", "CuvilDwPw"]
    assert_same_outputs(before, after)


@pytest.mark.parametrize("tail", ["y = Add(p, r)", "y = Relu(p)"])
def test_training_gets_the_convolutions_back(tail):
    from cuvil_edge.agent.torch_model import IRTorchModule

    text = _block(tail=tail, residual="Add" in tail)
    before = graph_from_text(text, **_weights())
    fused, _ = optimize(before)
    split = split_dw_pw(fused)
    assert op_types(split) == op_types(_unfused(before))  # the nodes the pipeline made before fusing
    assert_same_outputs(before, split)
    if len(split.inputs) == 1:  # training takes one input: its torch lowering computes the same
        x = np.random.default_rng(6).standard_normal((2, 8, 9, 7)).astype(np.float32)
        with torch.no_grad():
            got = IRTorchModule(split)(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, interpreter.run(before, {"x": x})["y"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width, fused", [(55, False), (56, True)])
def test_maps_narrower_than_the_default_width_are_left_alone(width, fused):
    before = graph_from_text(_block(tail="y = Add(p, r)", spatial=(3, width)), **_weights())
    after, _ = optimize(before)
    assert ("CuvilDwPw" in op_types(after)) == fused


def test_an_int8_package_quantizes_the_fused_blocks_convolutions():
    from cuvil_edge.coordinator.precision import with_precision

    before = graph_from_text(_block(tail="y = Add(p, r)", spatial=(9, 7)), **_weights())
    fused, _ = optimize(before)
    assert "CuvilDwPw" in op_types(fused)
    quantized, _ = with_precision(fused, "int8")
    # the same quantized ops as the graph that was never fused (QDQ around each conv's weights)
    assert op_types(quantized) == op_types(with_precision(_unfused(before), "int8")[0])
    assert "DequantizeLinear" in op_types(quantized) and "CuvilDwPw" not in op_types(quantized)
