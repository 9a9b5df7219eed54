"""Each pass on small ONNX-text graphs: the structure after the pass, and unchanged outputs."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.passes import (CommonSubexpressionElimination, ConstantFolding, DeadCodeElimination, FoldBatchNorm,
                               FuseActivation, FuseBias, RemoveIdentity, optimize)

from pass_helpers import assert_same_outputs, graph_from_text, op_types, w


def _bn(c):
    return {"s": w(c, low=0.5, high=1.5), "bb": w(c), "m": w(c), "v": w(c, low=0.5, high=2.0)}


# --- remove-identity -----------------------------------------------------------
def test_identity_removed_and_output_name_kept():
    # prepare: x -> Identity -> Relu -> Identity -> y (y is the graph output)
    g = graph_from_text("""g (float[N, 4] x) => (float[N, 4] y) {
        a = Identity(x)
        r = Relu(a)
        y = Identity(r)
    }""")
    # act
    result = RemoveIdentity()(g)
    # assert
    assert result.modified and op_types(result.graph) == ["Relu"]
    assert result.graph.nodes[0].outputs == ("y",) and result.graph.outputs[0].name == "y"
    assert_same_outputs(g, result.graph)


def test_identity_of_graph_input_to_output_stays():
    g = graph_from_text("g (float[N, 4] x) => (float[N, 4] y) { y = Identity(x) }")
    result = RemoveIdentity()(g)
    assert not result.modified and op_types(result.graph) == ["Identity"]


def test_inference_dropout_removed():
    g = graph_from_text("""g (float[N, 4] x) => (float[N, 4] y) {
        d = Dropout(x)
        y = Relu(d)
    }""")
    result = RemoveIdentity()(g)
    assert op_types(result.graph) == ["Relu"]
    assert_same_outputs(g, result.graph)


def test_dropout_with_mask_read_stays():
    g = graph_from_text("""g (float[N, 4] x) => (float[N, 4] y, float[N, 4] k) {
        d, mask = Dropout(x)
        y = Relu(d)
        k = Cast <to = 1> (mask)
    }""")
    assert "Dropout" in op_types(RemoveIdentity()(g).graph)


# --- dead-code ---------------------------------------------------------------------
def test_dead_nodes_and_initializers_removed():
    g = graph_from_text("""g (float[N, 4] x) => (float[N, 4] y) {
        unused = Add(x, c)
        also = Relu(unused)
        y = Relu(x)
    }""", c=w(4), spare=w(3))
    result = DeadCodeElimination()(g)
    assert op_types(result.graph) == ["Relu"] and not result.graph.initializers
    assert len(result.changes) == 3
    assert_same_outputs(g, result.graph)


# --- cse -----------------------------------------------------------------------------
def test_cse_merges_same_op_attrs_inputs_and_copied_initializers():
    c = w(4)
    g = graph_from_text("""g (float[N, 4] x) => (float[N, 4] y) {
        a = Add(x, c1)
        b = Add(x, c2)
        r1 = Relu(a)
        r2 = Relu(b)
        y = Mul(r1, r2)
    }""", c1=c, c2=c.copy())
    result = CommonSubexpressionElimination()(g)
    assert op_types(result.graph) == ["Add", "Relu", "Mul"] and list(result.graph.initializers) == ["c1"]
    assert_same_outputs(g, result.graph)


def test_cse_keeps_different_attrs():
    g = graph_from_text("""g (float[N, 4] x) => (float[N, 4] y) {
        a = Softmax <axis = 1> (x)
        b = Softmax <axis = 0> (x)
        y = Add(a, b)
    }""")
    assert not CommonSubexpressionElimination()(g).modified


# --- fold-constants ----------------------------------------------------------------
def test_constant_subexpression_folded():
    g = graph_from_text("""g (float[N, 4] x) => (float[N, 4] y) {
        c = Add(c1, c2)
        d = Mul(c, c2)
        y = Add(x, d)
    }""", c1=w(4), c2=w(4))
    result = ConstantFolding()(g)
    assert op_types(result.graph) == ["Add"]
    assert_same_outputs(g, result.graph)


SHAPE_FLATTEN = """g (float[N, 2, 3, 4] x) => (float[N, 24] y) {
    s = Shape(x)
    b = Gather <axis = 0> (s, zero)
    u = Unsqueeze(b, axes)
    t = Concat <axis = 0> (u, minus1)
    y = Reshape(x, t)
}"""


def test_shape_subgraph_folded_to_constant_reshape():
    # prepare: x.view(x.size(0), -1) as torch exports it with a dynamic batch
    g = graph_from_text(SHAPE_FLATTEN, zero=np.array(0, np.int64), axes=np.array([0], np.int64),
                        minus1=np.array([-1], np.int64))
    assert g.types["y"].shape == ("N", 24)
    # act
    out, report = optimize(g)
    # assert
    assert op_types(out) == ["Reshape"]
    shape = out.initializers[out.nodes[0].inputs[1]]
    assert shape.tolist() == [0, -1]
    assert_same_outputs(g, out)


# --- fold-batchnorm -------------------------------------------------------------------
def test_batchnorm_folded_into_conv():
    g = graph_from_text("""g (float[N, 3, 6, 6] x) => (float[N, 4, 6, 6] y) {
        c = Conv <pads = [1, 1, 1, 1]> (x, W, b)
        y = BatchNormalization <epsilon = 0.001> (c, s, bb, m, v)
    }""", W=w(4, 3, 3, 3), b=w(4), **_bn(4))
    result = FoldBatchNorm()(g)
    assert op_types(result.graph) == ["Conv"] and result.graph.nodes[0].outputs == ("y",)
    assert_same_outputs(g, result.graph)


def test_batchnorm_folded_into_gemm_transb_without_bias():
    g = graph_from_text("""g (float[N, 5] x) => (float[N, 3] y) {
        c = Gemm <transB = 1, alpha = 0.5> (x, W)
        y = BatchNormalization(c, s, bb, m, v)
    }""", W=w(3, 5), **_bn(3))
    result = FoldBatchNorm()(g)
    assert op_types(result.graph) == ["Gemm"]
    assert_same_outputs(g, result.graph)


def test_batchnorm_not_folded_when_conv_output_has_another_reader():
    g = graph_from_text("""g (float[N, 3, 4, 4] x) => (float[N, 4, 4, 4] y) {
        c = Conv(x, W)
        n = BatchNormalization(c, s, bb, m, v)
        y = Add(n, c)
    }""", W=w(4, 3, 1, 1), **_bn(4))
    assert not FoldBatchNorm()(g).modified


# --- fuse-bias -------------------------------------------------------------------------
@pytest.mark.parametrize("text,weights,op", [
    ("""g (float[N, 3, 5, 5] x) => (float[N, 4, 3, 3] y) { c = Conv(x, W)
        y = Add(c, b) }""", {"W": w(4, 3, 3, 3), "b": w(1, 4, 1, 1)}, "Conv"),
    ("""g (float[N, 3, 5, 5] x) => (float[N, 4, 3, 3] y) { c = Conv(x, W, b0)
        y = Add(b, c) }""", {"W": w(4, 3, 3, 3), "b0": w(4), "b": w(4, 1, 1)}, "Conv"),
    ("""g (float[N, 5] x) => (float[N, 3] y) { c = MatMul(x, W)
        y = Add(c, b) }""", {"W": w(5, 3), "b": w(3)}, "Gemm"),
    ("""g (float[N, 5] x) => (float[N, 3] y) { c = Gemm <beta = 2.0> (x, W, b0)
        y = Add(c, b) }""", {"W": w(5, 3), "b0": w(3), "b": w(1, 3)}, "Gemm"),
], ids=["conv_no_bias", "conv_bias_first_operand", "matmul_to_gemm", "gemm_beta"])
def test_bias_fused(text, weights, op):
    g = graph_from_text(text, **weights)
    result = FuseBias()(g)
    assert op_types(result.graph) == [op] and result.graph.nodes[0].outputs == ("y",)
    assert_same_outputs(g, result.graph)


def test_bias_not_fused_when_add_broadcasts_or_is_per_pixel():
    g = graph_from_text("""g (float[N, 3, 5, 5] x) => (float[N, 4, 3, 3] y) { c = Conv(x, W)
        y = Add(c, b) }""", W=w(4, 3, 3, 3), b=w(1, 4, 3, 3))
    assert not FuseBias()(g).modified


# --- fuse-activation ------------------------------------------------------------------
CONV = "g (float[N, 3, 5, 5] x) => (float[N, 4, 5, 5] y) {{ c = Conv <pads = [1, 1, 1, 1]> (x, W, b)\n {act} }}"
GEMM = "g (float[N, 5] x) => (float[N, 3] y) {{ c = Gemm <transB = 1> (x, W, b)\n {act} }}"
CONV_W = {"W": w(4, 3, 3, 3), "b": w(4)}
GEMM_W = {"W": w(3, 5), "b": w(3)}


@pytest.mark.parametrize("template,weights,act,op,name,opset,extra", [
    (CONV, CONV_W, "y = Relu(c)", "Relu", "relu", 13, {}),
    (GEMM, GEMM_W, "y = Relu(c)", "Relu", "relu", 13, {}),
    (CONV, CONV_W, "y = Clip(c, lo, hi)", "Clip", "relu6", 13,
     {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}),
    (CONV, CONV_W, "y = Sigmoid(c)", "Sigmoid", "sigmoid", 13, {}),
    (GEMM, GEMM_W, "y = Sigmoid(c)", "Sigmoid", "sigmoid", 13, {}),
    (CONV, CONV_W, "y = HardSwish(c)", "HardSwish", "hardswish", 14, {}),
    (GEMM, GEMM_W, "y = Gelu(c)", "Gelu", "gelu", 20, {}),
    (CONV, CONV_W, "y = Gelu(c)", "Gelu", "gelu", 20, {}),
], ids=["conv_relu", "gemm_relu", "conv_relu6", "conv_sigmoid", "gemm_sigmoid", "conv_hardswish", "gemm_gelu",
        "conv_gelu"])
def test_activation_fused(template, weights, act, op, name, opset, extra):
    g = graph_from_text(template.format(act=act), opset=opset, **weights, **extra)
    result = FuseActivation()(g)
    (node,) = result.graph.nodes
    assert node.op_type.startswith("CuvilFused") and node.attr("activation") == name
    assert_same_outputs(g, result.graph)


def test_clip_other_than_relu6_not_fused():
    g = graph_from_text(CONV.format(act="y = Clip(c, lo, hi)"), **CONV_W,
                        lo=np.array(0, np.float32), hi=np.array(5, np.float32))
    assert not FuseActivation()(g).modified


def test_fused_kernels_are_conv_then_the_activation_ops_own_kernel():
    from cuvil_edge.device_targets.codegen import Specialiser, template_functions
    from cuvil_edge.ir import ops
    from cuvil_edge.ir.graph import Node
    from cuvil_edge.ir.ops._activation import ACTIVATIONS
    from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES
    from cuvil_edge.passes._infra import with_

    g = graph_from_text(CONV.format(act="y = Relu(c)"), **CONV_W)
    node = FuseActivation()(g).graph.nodes[0]
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 5)).astype(np.float32)
    fused, conv = ops.get("CuvilFusedConv"), ops.get("Conv")
    plain = conv.kernel(with_(node, set_attrs={"activation": "none"}), x, CONV_W["W"], CONV_W["b"])[0]
    module = {"np": np, **DEFAULT_CAPABILITIES}
    exec("\n\n".join(text for _, text in template_functions()), module)
    for act, op_type in ACTIVATIONS.items():
        n = with_(node, set_attrs={"activation": act})
        if op_type is None:
            want = plain
        elif op_type == "Clip":
            want = np.clip(plain, np.float32(0), np.float32(6))
        else:
            want = ops.get(op_type).kernel(Node("a", op_type, ("c",), ("y",), {}, 20), plain)[0]
        # the interpreter, and the call a compiled module makes (a copy specialised for the node)
        np.testing.assert_array_equal(fused.kernel(n, x, CONV_W["W"], CONV_W["b"])[0], want)
        specialiser = Specialiser()
        call = specialiser.call(fused, n, ["x", "w", "b"], ["out"])
        exec("\n".join(specialiser.functions), module)
        scope = {**module, "x": x, "w": CONV_W["W"], "b": CONV_W["b"]}
        exec(call, scope)
        np.testing.assert_array_equal(scope["out"], want)
        assert ("_activate" in "\n".join(specialiser.functions)) == (act != "none")
