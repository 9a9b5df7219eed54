"""FuseConvAdd: a convolution read only by a same-shaped residual Add (and that Add's Relu) becomes
one CuvilConvAdd whose outputs match the unfused nodes (interpreter, compiled with and without the
native library, onnxruntime on a torch ResNet); nothing that only resembles the pattern is fused,
and training and int8 get the separate nodes back."""

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
from cuvil_edge.ir.ops import _native
from cuvil_edge.passes import FuseConvAdd, default_passes, optimize, split_fused_blocks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compiled_models


class _Payload:
    def __init__(self, graph):
        self.graph, self.payload_digest = graph, "cd" * 32


def _graph(tail: str = "s = Add(c, r)\n    y = Relu(s)", conv: str = "c = Conv <pads = [1, 1, 1, 1]> (x, wc, bc)",
           r_shape: str = "6, 9, 7", extra_out: str = "", opset: int = 13, **weights):
    text = f"""
g (float[N, 4, 9, 7] x, float[N, {r_shape}] r) => (float[N, 6, 9, 7] y{extra_out}) {{
    {conv}
    {tail}
}}"""
    return graph_from_text(text, opset=opset, **{"wc": w(6, 4, 3, 3), "bc": w(6), **weights})


def _unfused(graph):
    return optimize(graph, [p for p in default_passes() if not isinstance(p, FuseConvAdd)])[0]


def _feeds(batch=2, r_shape=(6, 9, 7)):
    rng = np.random.default_rng(4)
    return {"x": rng.standard_normal((batch, 4, 9, 7)).astype(np.float32),
            "r": rng.standard_normal((batch, *r_shape)).astype(np.float32)}


@pytest.mark.parametrize("tail, activation", [
    ("s = Add(c, r)\n    y = Relu(s)", "relu"),
    ("s = Add(r, c)\n    y = Relu(s)", "relu"),
    ("y = Add(c, r)", "none"),
])
def test_the_conv_add_relu_becomes_one_node_with_the_same_outputs(tail, activation):
    before = _graph(tail)
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilConvAdd"]
    assert after.nodes[0].attr("activation") == activation and after.nodes[0].inputs[3] == "r"
    assert_same_outputs(before, after)


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("target", ["x86-64", "ascend-310"])
def test_compiled_native_and_numpy_paths_match_the_interpreter(native, target, tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_EDGE_NATIVE", native)
    monkeypatch.setattr(_native, "_state", {})  # the library is loaded (or not) again under this setting
    before = _graph()
    after, _ = optimize(before)
    model = build(_Payload(after), target, cache_dir=tmp_path)
    assert ("cuvil_conv_gemm_f32" in model.source) == (target == "x86-64")
    for batch in (1, 3):
        feeds = _feeds(batch)
        np.testing.assert_allclose(model.run(feeds)["y"], interpreter.run(before, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_a_conv_without_bias_and_a_strided_1x1_are_fused():
    before = _graph(conv="c = Conv <strides = [1, 1]> (x, wc)", tail="y = Add(c, r)",
                    wc=w(6, 4, 1, 1))
    after, _ = optimize(before)
    assert op_types(after) == ["CuvilConvAdd"] and after.nodes[0].inputs[2] == ""
    assert_same_outputs(before, after)


NOT_FUSED = {
    "the conv output is read twice": {"tail": "s = Add(c, r)\n    y = Add(s, c)"},
    "the residual broadcasts": {"tail": "y = Add(c, r)", "r_shape": "6, 1, 7"},
    "the conv output is a graph output": {"tail": "y = Add(c, r)", "extra_out": ", float[N, 6, 9, 7] c"},
    "the conv has its own activation": {"conv": "d = Conv <pads = [1, 1, 1, 1]> (x, wc, bc)\n    c = Sigmoid(d)",
                                        "tail": "y = Add(c, r)"},
    "the Add is of the conv with itself": {"tail": "y = Add(c, c)"},
}


@pytest.mark.parametrize("case", sorted(NOT_FUSED))
def test_what_only_resembles_the_pattern_is_not_fused(case):
    before = _graph(**NOT_FUSED[case])
    after, _ = optimize(before)
    assert "CuvilConvAdd" not in op_types(after)
    assert_same_outputs(before, after)


def test_the_relu_of_an_add_read_twice_stays_apart():
    before = _graph(tail="s = Add(c, r)\n    t = Relu(s)\n    y = Add(t, s)")
    after, _ = optimize(before)
    assert op_types(after)[0] == "CuvilConvAdd" and after.nodes[0].attr("activation") == "none"
    assert_same_outputs(before, after)


def test_a_residual_computed_after_the_conv_keeps_the_order():
    before = _graph(tail="q = Relu(r)\n    s = Add(c, q)\n    y = Relu(s)")
    after, _ = optimize(before)
    assert op_types(after) == ["Relu", "CuvilConvAdd"]
    assert_same_outputs(before, after)


def test_the_fused_node_type_checks_its_residual():
    from cuvil_edge.errors import ShapeInferenceError
    from cuvil_edge.ir.graph import TensorType
    from cuvil_edge.ir.ops import get

    fused = optimize(_graph())[0].nodes[0]
    op, f32 = get("CuvilConvAdd"), "float32"
    x, wt, b = TensorType(f32, (1, 4, 9, 7)), TensorType(f32, (6, 4, 3, 3)), TensorType(f32, (6,))
    assert op.infer(fused, [x, wt, b, TensorType(f32, (1, 6, 9, 7))]) == [TensorType(f32, (1, 6, 9, 7))]
    with pytest.raises(ShapeInferenceError, match="residual"):
        op.infer(fused, [x, wt, b, TensorType(f32, (1, 6, 9, 8))])
    with pytest.raises(ShapeInferenceError, match="residual"):
        op.infer(fused, [x, wt, b])


@pytest.mark.parametrize("tail", ["s = Add(c, r)\n    y = Relu(s)", "y = Add(c, r)"])
def test_training_and_int8_get_the_separate_nodes_back(tail):
    from cuvil_edge.coordinator.precision import with_precision

    before = _graph(tail)
    fused, _ = optimize(before)
    split = split_fused_blocks(fused)
    assert "CuvilConvAdd" not in op_types(split)
    assert sorted(op_types(split)) == sorted(["Conv", "Add"] + (["Relu"] if "Relu" in tail else []))
    assert_same_outputs(before, split)
    assert [i.name for i in split.inputs] == ["x", "r"] and set(split.initializers) >= {"wc", "bc"}
    quantized, _ = with_precision(fused, "int8")
    assert op_types(quantized) == op_types(with_precision(_unfused(before), "int8")[0])
    assert "CuvilConvAdd" not in op_types(quantized)


def test_a_torch_resnet_matches_onnxruntime_with_its_residuals_fused(tmp_path):
    torch.manual_seed(0)
    model = compiled_models.randomise_statistics(compiled_models.ResNet(compiled_models.BasicBlock, (1, 1)).eval())
    x = torch.randn(1, 3, 64, 64)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    graph, _ = optimize(load_model(buffer.getvalue()))
    fused = op_types(graph).count("CuvilConvAdd")
    assert fused == 2 and "Add" not in op_types(graph)  # both blocks' residual Add and Relu are inside
    want = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    got = build(_Payload(graph), "x86-64", cache_dir=tmp_path).run({"x": x.numpy()})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
