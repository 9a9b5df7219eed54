"""Every op, at its important attribute combinations: interpreter and template vs onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.onnx_import import _nodes
from cuvil_edge.ir import interpreter, ops

from onnx_cases import In, assert_matches, batches, build_model, case, const, feeds_for, run_ort, run_template

B = "batch"
X4 = In((B, 2, 5, 5))
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731

CASES = [
    # --- Relu
    case("relu", "Relu", In((B, 3, 4))),
    case("relu_f64_opset6", "Relu", In((B, 3), np.float64), opset=6),
    # --- Gemm
    case("gemm_plain", "Gemm", In((B, 4)), const(4, 3), const(3)),
    case("gemm_transA", "Gemm", In((4, B)), const(4, 3), const(1, 3), transA=1),
    case("gemm_transB_alpha_beta", "Gemm", In((B, 4)), const(3, 4), const(3), transB=1, alpha=0.5, beta=2.0),
    case("gemm_both_trans_full_C", "Gemm", In((4, 2)), const(3, 4), const(2, 3), transA=1, transB=1, beta=0.25),
    case("gemm_scalar_C", "Gemm", In((B, 4)), const(4, 3), np.array(1.5, np.float32)),
    case("gemm_col_C", "Gemm", In((2, 4)), const(4, 3), const(2, 1)),
    case("gemm_no_C", "Gemm", In((B, 4)), const(4, 3), alpha=2.0),
    case("gemm_opset9", "Gemm", In((B, 4)), const(4, 3), const(3), opset=9),
    # --- Conv
    case("conv_pads_bias", "Conv", X4, const(4, 2, 3, 3), const(4), pads=[1, 1, 1, 1]),
    case("conv_strides_no_bias", "Conv", X4, const(3, 2, 3, 3), strides=[2, 2]),
    case("conv_asym_pads_strides", "Conv", X4, const(3, 2, 2, 3), const(3), pads=[0, 1, 1, 0], strides=[2, 1]),
    case("conv_dilations", "Conv", In((B, 2, 7, 7)), const(3, 2, 3, 3), dilations=[2, 2], pads=[1, 2, 1, 2]),
    case("conv_group2", "Conv", In((B, 4, 6, 6)), const(6, 2, 3, 3), const(6), group=2, pads=[1, 1, 1, 1]),
    case("conv_depthwise", "Conv", In((B, 3, 5, 5)), const(3, 1, 3, 3), const(3), group=3, strides=[2, 2]),
    case("conv_same_upper", "Conv", X4, const(4, 2, 3, 3), const(4), auto_pad="SAME_UPPER", strides=[2, 2]),
    case("conv_same_lower", "Conv", X4, const(4, 2, 4, 4), auto_pad="SAME_LOWER"),
    case("conv_valid", "Conv", X4, const(4, 2, 3, 3), auto_pad="VALID", kernel_shape=[3, 3]),
    case("conv_1x1", "Conv", X4, const(5, 2, 1, 1), const(5)),
    case("conv_1d", "Conv", In((B, 2, 9)), const(3, 2, 3), const(3), strides=[2], pads=[1, 0]),
    case("conv_3d", "Conv", In((B, 2, 4, 4, 4)), const(2, 2, 2, 2, 2), const(2)),
    case("conv_opset1", "Conv", In((B, 2, 5, 5)), const(3, 2, 3, 3), opset=1),
    # --- MaxPool
    case("maxpool_2x2_s2", "MaxPool", X4, kernel_shape=[2, 2], strides=[2, 2]),
    case("maxpool_pads", "MaxPool", X4, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    case("maxpool_ceil", "MaxPool", X4, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    case("maxpool_ceil_pads", "MaxPool", In((B, 2, 6, 6)), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1),
    case("maxpool_dilations", "MaxPool", In((B, 2, 7, 7)), kernel_shape=[2, 2], dilations=[2, 2]),
    case("maxpool_same_upper", "MaxPool", X4, kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    case("maxpool_1d", "MaxPool", In((B, 3, 9)), kernel_shape=[3], strides=[2]),
    case("maxpool_int8", "MaxPool", In((B, 2, 4, 4), np.int8), kernel_shape=[2, 2], pads=[1, 1, 0, 0], opset=12),
    case("maxpool_opset8", "MaxPool", X4, kernel_shape=[2, 2], opset=8),
    # --- AveragePool
    case("avgpool_2x2_s2", "AveragePool", X4, kernel_shape=[2, 2], strides=[2, 2]),
    case("avgpool_pads_exclude", "AveragePool", X4, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    case("avgpool_pads_include", "AveragePool", X4, kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    case("avgpool_ceil_exclude", "AveragePool", X4, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    case("avgpool_ceil_include_pads", "AveragePool", X4, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
         ceil_mode=1, count_include_pad=1),
    case("avgpool_1d", "AveragePool", In((B, 3, 9)), kernel_shape=[3], strides=[2], pads=[1, 1]),
    case("avgpool_dilations_opset19", "AveragePool", In((B, 2, 7, 7)), kernel_shape=[2, 2], dilations=[2, 2], opset=19),
    case("avgpool_same_upper", "AveragePool", X4, kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    # --- GlobalAveragePool
    case("gap_2d", "GlobalAveragePool", In((B, 3, 4, 5))),
    case("gap_1d", "GlobalAveragePool", In((B, 2, 7))),
    case("gap_3d", "GlobalAveragePool", In((B, 2, 3, 4, 5))),
    # --- Flatten
    case("flatten_axis1", "Flatten", In((B, 3, 4, 5))),
    case("flatten_axis0", "Flatten", In((2, 3, 4)), axis=0),
    case("flatten_axis2", "Flatten", In((2, 3, 4, 5)), axis=2),
    case("flatten_axis_neg1", "Flatten", In((2, 3, 4)), axis=-1),
    case("flatten_axis_rank", "Flatten", In((2, 3, 4), np.int64), axis=3),
    case("flatten_opset9", "Flatten", In((B, 3, 4)), opset=9),
    # --- Reshape
    case("reshape_minus1", "Reshape", In((B, 16, 4, 4)), I64(-1, 256)),
    case("reshape_zero_minus1", "Reshape", In((B, 16, 4, 4)), I64(0, -1)),
    case("reshape_zero_4_minus1", "Reshape", In((B, 16, 4, 4)), I64(0, 4, -1)),
    case("reshape_zero_zero_16", "Reshape", In((B, 16, 4, 4)), I64(0, 0, 16)),
    case("reshape_static_mid", "Reshape", In((2, 3, 4)), I64(3, -1, 2)),
    case("reshape_allowzero_opset14", "Reshape", In((B, 6)), I64(-1, 2, 3), allowzero=1, opset=14),
    case("reshape_int32_opset5", "Reshape", In((B, 6), np.int32), I64(0, 3, 2), opset=5),
    # --- Softmax
    case("softmax11_default", "Softmax", In((B, 3, 4)), opset=11),
    case("softmax11_axis2", "Softmax", In((B, 3, 4)), axis=2, opset=11),
    case("softmax11_axis0", "Softmax", In((B, 3, 4)), axis=0, opset=11),
    case("softmax11_axis_neg2", "Softmax", In((B, 3, 4)), axis=-2, opset=11),
    case("softmax13_default", "Softmax", In((B, 3, 4))),
    case("softmax13_axis1", "Softmax", In((B, 3, 4)), axis=1),
    case("softmax13_axis0_f64", "Softmax", In((B, 3, 4), np.float64), axis=0),
    # --- Add / Mul
    case("add_vector", "Add", In((B, 3, 4)), const(4)),
    case("add_two_way", "Add", In((B, 1, 4)), const(3, 1)),
    case("add_inputs", "Add", In((B, 3, 1)), In((1, 4))),
    case("add_scalar", "Add", In((B, 3)), np.array(2.5, np.float32)),
    case("add_int32", "Add", In((B, 3), np.int32), const(3, dtype=np.int32)),
    case("add_int64", "Add", In((B, 3), np.int64), const(1, 3, dtype=np.int64)),
    case("add_f64_opset7", "Add", In((B, 2, 3), np.float64), const(3, dtype=np.float64), opset=7),
    case("mul_vector", "Mul", In((B, 3, 4)), const(4)),
    case("mul_two_way", "Mul", In((B, 1, 4)), const(3, 1)),
    case("mul_inputs", "Mul", In((B, 3, 1)), In((B, 1, 4))),
    case("mul_int32", "Mul", In((B, 3), np.int32), const(2, 1, 3, dtype=np.int32)),
    case("mul_int64", "Mul", In((B, 3), np.int64), np.array(3, np.int64)),
    case("mul_f64", "Mul", In((B, 3), np.float64), const(3, dtype=np.float64)),
    # --- MatMul
    case("matmul_3d_2d", "MatMul", In((B, 3, 4)), const(4, 5)),
    case("matmul_batch_broadcast", "MatMul", In((B, 1, 3, 4)), const(2, 4, 5)),
    case("matmul_vec_right", "MatMul", In((B, 3, 4)), const(4)),
    case("matmul_vec_left", "MatMul", In((4,)), In((B, 4, 5))),
    case("matmul_2d", "MatMul", In((B, 4)), const(4, 2)),
    case("matmul_int32", "MatMul", In((B, 3), np.int32), const(3, 2, dtype=np.int32)),
    case("matmul_int64", "MatMul", In((B, 3), np.int64), const(3, 2, dtype=np.int64)),
    # --- Identity
    case("identity", "Identity", In((B, 3))),
    case("identity_int64", "Identity", In((B, 2, 2), np.int64)),
    # --- Constant (folded into an initializer by the frontend)
    case("constant_tensor", "Constant", value=numpy_helper.from_array(const(2, 3), "v")),
    case("constant_int_tensor", "Constant", value=numpy_helper.from_array(np.arange(4, dtype=np.int32), "v")),
    case("constant_value_float", "Constant", value_float=1.25),
    case("constant_value_ints", "Constant", value_ints=[3, -1, 4]),
]

#: Capability settings each template is compiled under (the ones templates branch on).
CAPABILITIES = [{"TARGET_LARGE_SCRATCH": True}, {"TARGET_LARGE_SCRATCH": False}]


def test_every_registered_op_has_onnxruntime_cases():
    """Each op module is compared with onnxruntime by one of the op test tables."""
    import importlib

    covered = {c.op for c in CASES}
    for table in ("test_ops_shape", "test_ops_elementwise", "test_ops_quant", "test_ops_more"):
        covered |= {c.op if hasattr(c, "op") else c[1] for c in importlib.import_module(table).CASES}
    internal = {op for op in ops.supported_ops() if op.startswith("Cuvil")}  # fused ops: tests/passes
    assert set(ops.supported_ops()) - internal <= covered


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_interpreter_matches_onnxruntime(c):
    # prepare
    model = build_model(c)
    graph = load_model(model)
    for batch in batches(c):
        feeds = feeds_for(c, batch)
        expected = run_ort(model, feeds)
        # act
        actual = interpreter.run(graph, feeds)["y"]
        # assert
        assert_matches(actual, expected)
        assert graph.types["y"].bind({"batch": batch or 0}).shape == expected.shape


@pytest.mark.parametrize("capabilities", CAPABILITIES, ids=lambda caps: "large_scratch" if caps["TARGET_LARGE_SCRATCH"] else "low_memory")
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_template_matches_onnxruntime(c, capabilities):
    # prepare
    model = build_model(c)
    graph = load_model(model)
    proto = onnx.load_from_string(model)
    (node,) = graph.nodes or _nodes(proto.graph, c.opset)  # a folded Constant is rebuilt from the proto
    module = ops.get(node.op_type)
    for batch in batches(c):
        feeds = feeds_for(c, batch)
        expected = run_ort(model, feeds)
        # act
        actual = run_template(module, node, {**graph.initializers, **feeds}, capabilities)[0]
        # assert
        assert_matches(actual, expected)


# --- inference rejects what the op cannot do, with a typed error -------------------------

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError  # noqa: E402
from cuvil_edge.ir.graph import Node, TensorType, Value  # noqa: E402
from cuvil_edge.ir.infer import build_graph  # noqa: E402

BAD = [
    # id, op, x shape, x dtype, initializers, attrs, outputs, error, message fragment
    # -1 would be batch * 6 / 4, which no symbolic product names
    ("reshape_uneven_split", "Reshape", (3, 6), "float32", [I64(-1, 4)], {}, ("y",), ShapeInferenceError, "cannot resolve -1"),
    ("reshape_two_minus1", "Reshape", (B, 4), "float32", [I64(-1, -1)], {}, ("y",), ShapeInferenceError, "one -1"),
    ("reshape_count_differs", "Reshape", (2, 4), "float32", [I64(3, 3)], {}, ("y",), ShapeInferenceError, "cannot reshape"),
    ("conv_group_mismatch", "Conv", (B, 3, 5, 5), "float32", [const(4, 2, 3, 3)], {"group": 2}, ("y",), ShapeInferenceError, "group"),
    ("conv_int", "Conv", (B, 2, 5, 5), "int32", [const(4, 2, 3, 3, dtype=np.int32)], {}, ("y",), UnsupportedAttributeError, "int32"),
    ("maxpool_indices_storage_order", "MaxPool", (B, 2, 4, 4), "float32", [], {"kernel_shape": (2, 2), "storage_order": 2},
     ("y", "i"), UnsupportedAttributeError, "storage_order"),
    ("maxpool_no_kernel", "MaxPool", (B, 2, 4, 4), "float32", [], {}, ("y",), ShapeInferenceError, "kernel_shape"),
    ("add_bool", "Add", (B, 3), "bool", [np.ones(3, bool)], {}, ("y",), UnsupportedAttributeError, "bool"),
    ("add_dtype_mix", "Add", (B, 3), "float32", [np.ones(3, np.int64)], {}, ("y",), ShapeInferenceError, "different dtypes"),
    ("add_no_broadcast", "Add", (B, 3), "float32", [const(4)], {}, ("y",), ShapeInferenceError, "broadcast"),
    ("matmul_inner", "MatMul", (B, 3), "float32", [const(4, 2)], {}, ("y",), ShapeInferenceError, "inner dims"),
    ("softmax_axis", "Softmax", (B, 3), "float32", [], {"axis": 2}, ("y",), ShapeInferenceError, "axis 2"),
]


@pytest.mark.parametrize("id,op,shape,dtype,inits,attrs,outs,error,fragment", BAD, ids=[b[0] for b in BAD])
def test_infer_rejects(id, op, shape, dtype, inits, attrs, outs, error, fragment):
    # prepare
    names = {f"c{i}": a for i, a in enumerate(inits)}
    node = Node("n0", op, ("x", *names), outs, attrs)
    # act / assert
    with pytest.raises(error, match=fragment):
        build_graph(id, [Value("x", TensorType(dtype, shape))], list(outs), [node], names, 13)


def test_reshape_needs_constant_shape():
    node = Node("n0", "Reshape", ("x", "s"), ("y",))
    inputs = [Value("x", TensorType("float32", (B, 4))), Value("s", TensorType("int64", (2,)))]
    with pytest.raises(ShapeInferenceError, match="initializer or Constant"):
        build_graph("g", inputs, ["y"], [node], {}, 13)
