"""Elementwise ops at each of their ONNX versions and dtypes: interpreter and
template vs onnxruntime, plus typed errors for what ONNX does not allow."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError, UnsupportedOpError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter, ops
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph

from onnx_cases import Case, In, assert_matches, batches, case, const, feeds_for, node_inputs, ort, run_template

B = "batch"
F16, F64, I8, I32, I64, U8, U16, U32, BOOL = (np.float16, np.float64, np.int8, np.int32, np.int64,
                                              np.uint8, np.uint16, np.uint32, np.bool_)


def arr(*values, dtype=np.float32):
    return np.array(values, dtype=dtype)


def f(x, dtype=np.float32):
    return np.array(x, dtype=dtype)


EDGE = arr(-100.0, -20.0, -3.5, -1.0, -0.0, 0.0, 1e-30, 0.5, 1.0, 3.5, 20.0, 88.0, 100.0)
WIDE = np.linspace(-6, 6, 49, dtype=np.float32)
NONZERO_I = arr(3, -2, 5, -4, 1, -1, dtype=np.int32)

CASES = [
    # --- LeakyRelu: 6, 16
    case("leakyrelu_default", "LeakyRelu", In((B, 3, 4))),
    case("leakyrelu_alpha_opset16", "LeakyRelu", In((B, 3, 4)), alpha=0.2, opset=16),
    case("leakyrelu_f16", "LeakyRelu", In((B, 5), F16), alpha=0.1),
    case("leakyrelu_f64_opset7", "LeakyRelu", In((B, 5), F64), opset=7),
    # --- Sigmoid / Tanh: 6, 13
    case("sigmoid", "Sigmoid", In((B, 3, 4))),
    case("sigmoid_opset7", "Sigmoid", In((B, 3)), opset=7),
    case("sigmoid_f16", "Sigmoid", In((B, 6), F16)),
    case("sigmoid_f64", "Sigmoid", In((B, 6), F64)),
    case("sigmoid_edges", "Sigmoid", EDGE),
    case("tanh", "Tanh", In((B, 3, 4))),
    case("tanh_opset7", "Tanh", In((B, 3)), opset=7),
    case("tanh_f16", "Tanh", In((B, 6), F16)),
    case("tanh_f64_edges", "Tanh", EDGE.astype(F64)),
    # --- HardSigmoid: 6, 22 / HardSwish: 14, 22
    case("hardsigmoid_default", "HardSigmoid", WIDE),
    case("hardsigmoid_attrs_opset22", "HardSigmoid", In((B, 3, 4)), alpha=0.3, beta=0.4, opset=22),
    case("hardsigmoid_f16", "HardSigmoid", WIDE.astype(F16)),
    case("hardsigmoid_f64_opset7", "HardSigmoid", In((B, 4), F64), opset=7),
    case("hardswish_opset14", "HardSwish", WIDE, opset=14),
    case("hardswish_opset22", "HardSwish", In((B, 3, 4)), opset=22),
    case("hardswish_f16", "HardSwish", WIDE.astype(F16), opset=14),
    case("hardswish_f64", "HardSwish", WIDE.astype(F64), opset=14),
    # --- Clip: 6 (attributes), 11 (inputs), 12 (ints), 13
    case("clip6_attrs", "Clip", In((B, 3, 4)), min=-0.5, max=0.5, opset=7),
    case("clip6_defaults", "Clip", EDGE, opset=7),
    case("clip6_min_only_f64", "Clip", In((B, 4), F64), min=0.0, opset=10),
    case("clip11_min_max", "Clip", In((B, 3, 4)), f(-0.5), f(0.5), opset=11),
    case("clip11_min_only", "Clip", In((B, 4)), f(0.0), opset=11),
    case("clip12_max_only", "Clip", In((B, 4)), None, f(0.25), opset=12),
    case("clip12_int32", "Clip", In((B, 6), I32), f(-2, I32), f(3, I32), opset=12),
    case("clip13_int64", "Clip", In((B, 6), I64), f(-1, I64), f(2, I64)),
    case("clip13_int8", "Clip", In((B, 6), I8), f(-3, I8), f(1, I8)),
    case("clip13_uint8", "Clip", In((B, 6), U8), f(1, U8), f(4, U8)),
    case("clip13_f16", "Clip", In((B, 6), F16), f(-1, F16), f(1, F16)),
    case("clip13_min_gt_max", "Clip", In((B, 4)), f(1.0), f(-1.0)),
    case("clip13_no_bounds", "Clip", In((B, 4))),
    case("clip13_shape1_bounds", "Clip", In((B, 4)), arr(-0.1), arr(0.2)),
    # --- Sub: 7, 13, 14
    case("sub_bcast", "Sub", In((B, 3, 4)), const(4)),
    case("sub_two_inputs", "Sub", In((B, 3, 1)), In((1, 4))),
    case("sub_opset7_f64", "Sub", In((B, 3), F64), const(3, dtype=F64), opset=7),
    case("sub_int32", "Sub", In((B, 3), I32), const(3, dtype=I32)),
    case("sub_int64", "Sub", In((B, 3), I64), f(7, I64)),
    case("sub_uint32_wraps", "Sub", In((B, 3), U32), arr(7, 0, 1, dtype=U32)),
    case("sub_int8_opset14", "Sub", In((B, 3), I8), arr(127, -128, 5, dtype=I8), opset=14),
    case("sub_uint8_opset14", "Sub", In((B, 3), U8), arr(7, 0, 200, dtype=U8), opset=14),
    case("sub_f16", "Sub", In((B, 3), F16), const(3, dtype=F16)),
    # --- Div: 7, 13, 14 (ints truncate toward zero)
    case("div_bcast", "Div", In((B, 3, 4)), const(4)),
    case("div_two_inputs", "Div", In((B, 3, 1)), In((1, 4))),
    case("div_by_zero", "Div", arr(1.0, -1.0, 0.0, 2.5), arr(0.0, 0.0, 0.0, -0.0)),
    case("div_int32_trunc", "Div", In((B, 6), I32), NONZERO_I),
    case("div_int32_signs", "Div", arr(7, -7, 7, -7, 0, -9, dtype=I32), arr(2, 2, -2, -2, 3, 4, dtype=I32)),
    case("div_int64", "Div", In((B, 6), I64), NONZERO_I.astype(I64)),
    case("div_uint32_opset7", "Div", In((B, 3), U32), arr(2, 3, 7, dtype=U32), opset=7),
    case("div_int8_opset14", "Div", In((B, 6), I8), NONZERO_I.astype(I8), opset=14),
    case("div_uint16_opset14", "Div", In((B, 3), U16), arr(2, 3, 7, dtype=U16), opset=14),
    case("div_f16", "Div", In((B, 3), F16), const(3, dtype=F16)),
    case("div_f64_opset7", "Div", In((B, 3), F64), const(3, dtype=F64), opset=7),
    # --- Sum: 6 (same shapes), 8 (broadcast), 13
    case("sum_one", "Sum", In((B, 3))),
    case("sum_two_opset7", "Sum", In((2, 3)), const(2, 3), opset=7),
    case("sum_three_bcast_opset8", "Sum", In((B, 3, 1)), const(4), In((1, 1, 4)), opset=8),
    case("sum_four", "Sum", In((B, 3)), const(3), const(1, 3), In((B, 1))),
    case("sum_f16", "Sum", In((B, 3), F16), const(3, dtype=F16), const(1, dtype=F16)),
    case("sum_f64", "Sum", In((B, 3), F64), const(3, dtype=F64)),
    # --- Exp / Log / Sqrt: 6, 13
    case("exp", "Exp", In((B, 3, 4))),
    case("exp_opset7_f64", "Exp", In((B, 3), F64), opset=7),
    case("exp_f16", "Exp", In((B, 6), F16)),
    case("exp_edges", "Exp", EDGE),
    case("log", "Log", In((B, 3, 4))),
    case("log_opset7_f64", "Log", In((B, 3), F64), opset=7),
    case("log_f16", "Log", In((B, 6), F16)),
    case("log_edges", "Log", EDGE),
    case("sqrt", "Sqrt", In((B, 3, 4))),
    case("sqrt_opset7_f64", "Sqrt", In((B, 3), F64), opset=7),
    case("sqrt_f16", "Sqrt", In((B, 6), F16)),
    case("sqrt_edges", "Sqrt", EDGE),
    # --- Pow: 7 (same float dtype), 12 (int base, mixed exponent), 13, 15
    case("pow_opset7", "Pow", In((B, 4)), arr(2.0, 0.5, -1.0, 3.0), opset=7),
    case("pow_two_inputs", "Pow", In((B, 3, 1)), In((1, 4))),
    case("pow_f32_int_exponent_opset15", "Pow", In((B, 4)), arr(2, 3, -1, 0, dtype=I64), opset=15),
    case("pow_int32_int32_opset12", "Pow", In((B, 4), I32), arr(0, 1, 2, 3, dtype=I32), opset=12),
    case("pow_int64_negative_exponent", "Pow", arr(2, -3, 1, -1, 4, dtype=I64), arr(-1, 3, -5, -2, 0, dtype=I64)),
    case("pow_int32_float_exponent", "Pow", arr(2, 9, 4, 7, dtype=I32), arr(0.5, 0.5, -1.0, 1.5)),
    case("pow_f16", "Pow", In((B, 4), F16), arr(2.0, 3.0, 1.0, 0.0, dtype=F16)),
    case("pow_f64_int32_exponent", "Pow", In((B, 3), F64), arr(0, 2, 5, dtype=I32), opset=13),
    # --- Erf: 9, 13
    case("erf", "Erf", In((B, 3, 4))),
    case("erf_opset9", "Erf", In((B, 3)), opset=9),
    case("erf_f16", "Erf", In((B, 6), F16)),
    case("erf_f64", "Erf", np.linspace(-7, 7, 57)),
    case("erf_wide", "Erf", WIDE),
    # --- Gelu: 20
    case("gelu_none", "Gelu", In((B, 3, 4)), opset=20),
    case("gelu_tanh", "Gelu", In((B, 3, 4)), approximate="tanh", opset=20),
    case("gelu_wide", "Gelu", WIDE, opset=20),
    case("gelu_f16", "Gelu", In((B, 6), F16), opset=20),
    case("gelu_tanh_f64", "Gelu", WIDE.astype(F64), approximate="tanh", opset=20),
    # --- Dropout: 7, 10, 12, 13, 22 (inference)
    case("dropout_opset7", "Dropout", In((B, 3)), opset=7),
    case("dropout_mask_opset7", "Dropout", In((B, 3)), ratio=0.3, opset=7),
    case("dropout_mask_opset10", "Dropout", In((B, 3)), opset=10),
    case("dropout_mask_opset12", "Dropout", In((B, 3)), f(0.5), f(False, BOOL), opset=12),
    case("dropout_mask_opset13_f16", "Dropout", In((B, 3), F16)),
    case("dropout_opset22_f64", "Dropout", In((B, 3), F64), f(0.1, F64), opset=22),
    case("dropout_training_zero_ratio", "Dropout", In((B, 3)), f(0.0), f(True, BOOL), opset=13),
    case("dropout_training_zero_ratio_mask_opset22", "Dropout", In((B, 3)), f(0.0), f(True, BOOL), opset=22),
    # --- Where: 9, 16
    case("where_bcast", "Where", In((B, 1, 4), BOOL), const(3, 4), In((B, 3, 1)), opset=9),
    case("where_int64", "Where", In((B, 3), BOOL), In((B, 3), I64), f(-1, I64), opset=16),
    case("where_f16", "Where", arr(True, False, True, dtype=BOOL), In((B, 3), F16), const(3, dtype=F16)),
    case("where_uint8", "Where", arr(True, False, dtype=BOOL), In((B, 2), U8), In((B, 2), U8)),
    # --- Equal: 7 (bool/int32/int64), 11 (all), 13, 19
    case("equal_int64_opset7", "Equal", In((B, 4), I64), arr(0, 1, 2, -1, dtype=I64), opset=7),
    case("equal_bool_opset7", "Equal", In((B, 3), BOOL), arr(True, False, True, dtype=BOOL), opset=7),
    case("equal_int32_bcast", "Equal", In((B, 3, 1), I32), In((1, 4), I32)),
    case("equal_f32_nan_opset11", "Equal", arr(1.0, 2.0, np.nan, 0.0), arr(1.0, 3.0, np.nan, -0.0), opset=11),
    case("equal_f16_opset19", "Equal", arr(1.0, 2.0, 3.0, dtype=F16), arr(1.0, 2.5, 3.0, dtype=F16), opset=19),
    case("equal_uint8", "Equal", In((B, 4), U8), arr(0, 1, 2, 3, dtype=U8)),
    # --- Less / Greater: 7 (floats), 9 (ints), 13
    case("less_f32_opset7", "Less", In((B, 3, 4)), const(4), opset=7),
    case("less_int32_opset9", "Less", In((B, 4), I32), arr(0, 1, -2, 5, dtype=I32), opset=9),
    case("less_nan", "Less", arr(1.0, np.nan, 2.0), arr(np.nan, 1.0, 3.0)),
    case("less_f16", "Less", In((B, 4), F16), const(4, dtype=F16)),
    case("less_uint16", "Less", In((B, 4), U16), arr(0, 1, 2, 9, dtype=U16)),
    case("greater_f32_opset7", "Greater", In((B, 3, 1)), In((1, 4)), opset=7),
    case("greater_int64_opset9", "Greater", In((B, 4), I64), arr(0, 1, -2, 5, dtype=I64), opset=9),
    case("greater_f64", "Greater", In((B, 4), F64), const(4, dtype=F64)),
    case("greater_int8", "Greater", In((B, 4), I8), arr(0, 1, -2, 5, dtype=I8)),
    # --- Not: 1
    case("not", "Not", In((B, 3), BOOL)),
    case("not_opset7", "Not", arr(True, False, dtype=BOOL), opset=7),
    # --- Cast: 6, 9, 13, 19, 21, ...
    case("cast_f32_to_int32_opset7", "Cast", WIDE, to=6, opset=7),
    case("cast_f32_to_f16", "Cast", In((B, 5)), to=10),
    case("cast_f16_to_f32_opset9", "Cast", In((B, 5), F16), to=1, opset=9),
    case("cast_f32_to_bool", "Cast", arr(0.0, -0.0, 1.5, np.nan, -2.0), to=9),
    case("cast_bool_to_f32", "Cast", In((B, 3), BOOL), to=1),
    case("cast_int64_to_int8_wraps", "Cast", arr(300, -129, 5, -5, dtype=I64), to=3, opset=19),
    case("cast_int32_to_f64", "Cast", In((B, 3), I32), to=11, opset=21),
    case("cast_f64_to_f32", "Cast", In((B, 3), F64), to=1),
    case("cast_uint8_to_int64", "Cast", In((B, 3), U8), to=7),
    case("cast_f32_to_uint8", "Cast", arr(0.0, 1.9, 200.5, 255.0), to=2),
    case("cast_int32_to_bool", "Cast", In((B, 3), I32), to=9),
    case("cast_f16_to_int64", "Cast", arr(-2.5, 0.5, 1000.0, dtype=F16), to=7),
    # --- Add / Mul / Relu at the versions that widened their dtypes
    case("add_int8_opset14", "Add", In((B, 3), I8), arr(127, -128, 5, dtype=I8), opset=14),
    case("add_uint16_opset14", "Add", In((B, 3), U16), arr(65535, 0, 5, dtype=U16), opset=14),
    case("add_uint32_opset7", "Add", In((B, 3), U32), arr(1, 2, 3, dtype=U32), opset=7),
    case("add_f16", "Add", In((B, 3), F16), const(3, dtype=F16)),
    case("mul_int16_opset14", "Mul", In((B, 3), np.int16), arr(1000, -3, 5, dtype=np.int16), opset=14),
    case("mul_uint8_opset14", "Mul", In((B, 3), U8), arr(100, 3, 5, dtype=U8), opset=14),
    case("mul_f16_opset7", "Mul", In((B, 3), F16), const(3, dtype=F16), opset=7),
    case("relu_int8_opset14", "Relu", In((B, 3), I8), opset=14),
    case("relu_int32_opset14", "Relu", In((B, 3), I32), opset=14),
    case("relu_f16_opset13", "Relu", In((B, 3), F16)),
    case("relu_f32_opset7", "Relu", In((B, 3)), opset=7),
    # --- the unary tables (cuvil_edge/ir/ops/unary.py, activation.py, trigonometric.py)
    case("abs_i32", "Abs", In((B, 5), I32)),
    case("abs_f16", "Abs", In((B, 5), F16)),
    case("neg_i64", "Neg", In((B, 5), I64)),
    case("neg_edges", "Neg", EDGE),
    case("reciprocal", "Reciprocal", arr(3.0, -2.0, 0.5, -4.0, 1e-3)),
    case("floor", "Floor", WIDE),
    case("ceil_f64", "Ceil", WIDE.astype(F64)),
    case("round_halves_to_even", "Round", arr(-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51), opset=11),
    case("sign_i32", "Sign", NONZERO_I),
    case("sign_edges", "Sign", EDGE),
    case("sin", "Sin", WIDE),
    case("cos_f16", "Cos", WIDE.astype(F16)),
    case("tan", "Tan", arr(-1.2, 0.3, 1.0)),
    case("asin", "Asin", arr(-1.0, -0.5, 0.0, 0.7, 1.0)),
    case("acos", "Acos", arr(-1.0, -0.5, 0.0, 0.7, 1.0)),
    case("atan", "Atan", WIDE),
    case("sinh", "Sinh", WIDE),
    case("cosh", "Cosh", WIDE),
    case("asinh", "Asinh", WIDE),
    case("acosh", "Acosh", arr(1.0, 1.5, 3.0, 10.0)),
    case("atanh", "Atanh", arr(-0.9, 0.0, 0.5, 0.99)),
    case("softplus_edges", "Softplus", EDGE),
    case("softsign_f16", "Softsign", WIDE.astype(F16)),
    case("elu_alpha", "Elu", WIDE, alpha=0.7),
    case("selu", "Selu", WIDE),
    case("selu_attrs_f64", "Selu", WIDE.astype(F64), alpha=2.0, gamma=3.0),
    case("celu", "Celu", WIDE, alpha=2.0, opset=12),
    case("thresholdedrelu", "ThresholdedRelu", WIDE, alpha=0.3, opset=10),
    case("shrink", "Shrink", WIDE, lambd=0.8, bias=0.2, opset=9),
    case("mish", "Mish", EDGE, opset=18),
    case("isnan", "IsNaN", arr(np.nan, 1.0, np.inf, -np.inf, 0.0)),
    case("isinf_positive_only", "IsInf", arr(np.nan, 1.0, np.inf, -np.inf, 0.0), detect_negative=0, opset=10),
    # --- the multi-input table (cuvil_edge/ir/ops/binary.py)
    case("min_three_bcast", "Min", In((B, 3, 1)), const(4), In((1, 1, 4))),
    case("min_i32_opset12", "Min", In((B, 3), I32), const(3, dtype=I32), opset=12),
    case("max_one", "Max", In((B, 3))),
    case("max_u8", "Max", In((B, 3), U8), const(3, dtype=U8)),
    case("mean_two", "Mean", In((B, 3)), const(3)),
    case("mod_int_sign_of_divisor", "Mod", NONZERO_I, arr(3, -3, 2, -2, 5, 4, dtype=I32)),
    case("mod_fmod_f32", "Mod", In((B, 4)), arr(1.5, -2.0, 3.0, -0.5), fmod=1),
    case("and", "And", In((B, 4), BOOL), const(4, dtype=BOOL), opset=7),
    case("or", "Or", In((B, 4), BOOL), const(4, dtype=BOOL), opset=7),
    case("xor", "Xor", In((B, 4), BOOL), const(4, dtype=BOOL), opset=7),
    case("bitwise_and_i32", "BitwiseAnd", In((B, 4), I32), const(4, dtype=I32), opset=18),
    case("bitwise_or_u8", "BitwiseOr", In((B, 4), U8), const(4, dtype=U8), opset=18),
    case("bitwise_xor_i64", "BitwiseXor", In((B, 4), I64), const(4, dtype=I64), opset=18),
    case("bitwise_not_u8", "BitwiseNot", In((B, 4), U8), opset=18),
    case("bitshift_left_u32", "BitShift", In((B, 4), U32), arr(1, 2, 3, 0, dtype=U32), direction="LEFT", opset=11),
    case("bitshift_right_u8", "BitShift", In((B, 4), U8), arr(1, 2, 7, 0, dtype=U8), direction="RIGHT", opset=11),
    case("prelu_per_channel", "PRelu", In((B, 3, 4)), const(3, 1)),
    case("prelu_scalar_opset16", "PRelu", In((B, 3)), const(1), opset=16),
]

#: Cases whose node writes a second output ("mask").
TWO_OUTPUTS = {"dropout_mask_opset7", "dropout_mask_opset10", "dropout_mask_opset12", "dropout_mask_opset13_f16",
               "dropout_training_zero_ratio_mask_opset22"}
CAPABILITIES = [{"TARGET_LARGE_SCRATCH": True}, {"TARGET_LARGE_SCRATCH": False}]


def _outputs(c: Case) -> list[str]:
    return ["y", "mask"] if c.id in TWO_OUTPUTS else ["y"]


def build(c: Case) -> bytes:
    """One node "n0" reading in0, in1 ... (None: an omitted optional input); outputs typed by ONNX inference."""
    inputs, inits, names = node_inputs(c.args, lambda a: isinstance(a, In))
    node = helper.make_node(c.op, names, _outputs(c), name="n0", **c.attrs)
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in _outputs(c)]
    graph = helper.make_graph([node], c.id, inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for out in model.graph.output:
        if not out.type.HasField("tensor_type"):  # Dropout-7's mask: ONNX infers nothing; it is T
            out.CopyFrom(helper.make_tensor_value_info(out.name, _first_dtype(model), None))
            out.type.tensor_type.shape.SetInParent()  # rank unknown
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _first_dtype(model: onnx.ModelProto) -> int:
    first = model.graph.node[0].input[0]
    for t in model.graph.initializer:
        if t.name == first:
            return t.data_type
    return next(v.type.tensor_type.elem_type for v in model.graph.input if v.name == first)


def _ort_all(model: bytes, feeds: dict, names: list[str]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(names, feeds)


def _in_float32(c: Case) -> Case:
    """The same case with float16/float64 tensors in float32."""
    def change(a):
        if isinstance(a, In) and np.dtype(a.dtype) in (F16, F64):
            return In(a.shape, np.float32)
        return a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype in (F16, F64) else a
    return Case(c.id, c.op, tuple(change(a) for a in c.args), c.attrs, c.opset)


def expected_outputs(c: Case, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs.  Where its CPU provider has no float16 or float64 kernel
    for the op, the case runs in float32 and the outputs are converted back
    (float16: one rounding of the float32 result; float64: compared at fp32 tolerance)."""
    try:
        return _ort_all(build(c), feeds, _outputs(c))
    except Exception as e:  # onnxruntime raises its own NotImplemented type
        dtype = next((np.dtype(a.dtype) for a in c.args if getattr(a, "dtype", None) in (F16, F64)), None)
        if "NOT_IMPLEMENTED" not in str(e) or dtype is None:
            raise
    narrow = {k: v.astype(np.float32) if v.dtype in (F16, F64) else v for k, v in feeds.items()}
    outs = _ort_all(build(_in_float32(c)), narrow, _outputs(c))
    return [o.astype(dtype) if o.dtype == np.float32 else o for o in outs]


def check(actual: np.ndarray, expected: np.ndarray) -> None:
    """Exact dtype and shape; fp32/fp64 at onnx_cases' tolerance, fp16 at rtol 1e-3, ints and bools exact."""
    if expected.dtype == F16:
        assert isinstance(actual, np.ndarray) and actual.dtype == F16 and actual.shape == expected.shape
        np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32), rtol=1e-3, atol=1e-3)
    elif expected.dtype.kind == "f":
        assert_matches(actual, expected)
    else:
        assert isinstance(actual, np.ndarray) and actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_interpreter_matches_onnxruntime(c):
    # prepare
    graph = load_model(build(c))
    for batch in batches(c):
        feeds = feeds_for(c, batch)
        expected = expected_outputs(c, feeds)
        # act
        actual = interpreter.run(graph, feeds) if len(expected) == 1 else _run_all(graph, feeds)
        # assert
        for name, want in zip(_outputs(c), expected):
            check(actual[name], want)
            assert graph.types[name].bind({"batch": batch or 0}).shape == want.shape


def _run_all(graph, feeds):
    from dataclasses import replace
    outs = tuple(Value(o, graph.types[o]) for o in ("y", "mask"))
    return interpreter.run(replace(graph, outputs=outs), feeds)


@pytest.mark.parametrize("capabilities", CAPABILITIES, ids=lambda caps: "large_scratch" if caps["TARGET_LARGE_SCRATCH"] else "low_memory")
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_template_matches_onnxruntime(c, capabilities):
    # prepare
    graph = load_model(build(c))
    (node,) = graph.nodes
    module = ops.get(node.op_type)
    for batch in batches(c):
        feeds = feeds_for(c, batch)
        expected = expected_outputs(c, feeds)
        # act
        actual = run_template(module, node, {**graph.initializers, **feeds}, capabilities)
        # assert
        for got, want in zip(actual, expected):
            check(got, want)


def test_cases_cover_my_ops_at_every_version():
    """Every VERSIONS entry of each elementwise op (beyond bfloat16/float8/string-only ones) is exercised."""
    mine = {"LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Clip", "Sub", "Div", "Sum", "Exp", "Log",
            "Sqrt", "Pow", "Erf", "Gelu", "Dropout", "Where", "Equal", "Less", "Greater", "Not", "Cast"}
    assert mine <= {c.op for c in CASES}
    for op in mine | {"Add", "Mul", "Relu"}:
        versions = ops.get(op).VERSIONS
        used = {max(v for v in versions if v <= c.opset) for c in CASES if c.op == op}
        type_only = {v for v in versions if v in (13, 16, 22) or (op == "Cast" and v >= 23)}
        assert set(versions) - type_only <= used | {16, 22}, (op, sorted(set(versions) - used))


def test_where_bool_matches_onnxruntime_on_uint8():
    """onnxruntime has no bool Where kernel; the same selection on uint8 0/1 is the oracle."""
    c = case("where_bool", "Where", In((B, 3), BOOL), In((B, 3), BOOL), arr(False, True, False, dtype=BOOL))
    as_u8 = case("where_u8", "Where", In((B, 3), BOOL), In((B, 3), U8), arr(0, 1, 0, dtype=U8))
    graph = load_model(build(c))
    feeds = feeds_for(c, 4)
    expected = _ort_all(build(as_u8), {"in0": feeds["in0"], "in1": feeds["in1"].astype(U8)}, ["y"])[0].astype(BOOL)
    check(interpreter.run(graph, feeds)["y"], expected)
    check(run_template(ops.get("Where"), graph.nodes[0], {**graph.initializers, **feeds}, {})[0], expected)


# --- Erf accuracy, and integer Erf (opset 9), which onnxruntime has no kernel for -------------

def test_erf_is_accurate_to_float64():
    x = np.concatenate([np.linspace(-8, 8, 20001), np.logspace(-30, 1.5, 500), -np.logspace(-30, 1.5, 500)])
    node = Node("n0", "Erf", ("x",), ("y",), {}, 13)
    got = ops.get("Erf").kernel(node, x)[0]
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(got, want, rtol=2e-15, atol=0)


def test_erf_opset9_int_truncates_like_onnx_reference():
    x = np.array([-3, -1, 0, 1, 2, 7], np.int32)
    node = Node("n0", "Erf", ("x",), ("y",), {}, 9)
    got = ops.get("Erf").kernel(node, x)[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.array([math.erf(v) for v in x]).astype(np.int32))


# --- inference rejects what ONNX does not allow, with a typed error naming the node -----------

BAD = [
    # id, op, opset, input types, initializers, attrs, outputs, error, message fragment
    ("sigmoid_int32", "Sigmoid", 13, [("int32", (B, 3))], [], {}, 1, UnsupportedAttributeError, "int32"),
    ("add_int8_opset13", "Add", 13, [("int8", (B, 3))], [np.ones(3, I8)], {}, 1, UnsupportedAttributeError, "int8"),
    ("relu_int8_opset13", "Relu", 13, [("int8", (B, 3))], [], {}, 1, UnsupportedAttributeError, "int8"),
    ("relu_uint8_opset14", "Relu", 14, [("uint8", (B, 3))], [], {}, 1, UnsupportedAttributeError, "uint8"),
    ("sub_bool", "Sub", 14, [("bool", (B, 3))], [np.ones(3, BOOL)], {}, 1, UnsupportedAttributeError, "bool"),
    ("div_dtype_mix", "Div", 13, [("float32", (B, 3))], [np.ones(3, I64)], {}, 1, ShapeInferenceError, "different dtypes"),
    ("div_no_broadcast", "Div", 13, [("float32", (B, 3))], [np.ones(4, np.float32)], {}, 1, ShapeInferenceError, "broadcast"),
    ("equal_float_opset7", "Equal", 7, [("float32", (B, 3))], [np.ones(3, np.float32)], {}, 1, UnsupportedAttributeError, "float32"),
    ("less_int_opset7", "Less", 7, [("int32", (B, 3))], [np.ones(3, I32)], {}, 1, UnsupportedAttributeError, "int32"),
    ("greater_bool", "Greater", 13, [("bool", (B, 3))], [np.ones(3, BOOL)], {}, 1, UnsupportedAttributeError, "bool"),
    ("not_float", "Not", 13, [("float32", (B, 3))], [], {}, 1, UnsupportedAttributeError, "float32"),
    ("cast_to_string", "Cast", 13, [("float32", (B, 3))], [], {"to": 8}, 1, UnsupportedAttributeError, "ONNX type 8"),
    ("cast_to_bfloat16", "Cast", 13, [("float32", (B, 3))], [], {"to": 16}, 1, UnsupportedAttributeError, "ONNX type 16"),
    ("cast_no_to", "Cast", 13, [("float32", (B, 3))], [], {}, 1, UnsupportedAttributeError, "None"),
    ("gelu_bad_approximate", "Gelu", 20, [("float32", (B, 3))], [], {"approximate": "fast"}, 1,
     UnsupportedAttributeError, "approximate"),
    ("gelu_int", "Gelu", 20, [("int32", (B, 3))], [], {}, 1, UnsupportedAttributeError, "int32"),
    ("dropout_training_true", "Dropout", 13, [("float32", (B, 3))], [f(0.5), f(True, BOOL)], {}, 1,
     UnsupportedAttributeError, "training"),
    ("dropout_training_ratio_not_constant", "Dropout", 13, [("float32", (B, 3)), ("float32", ())], [f(True, BOOL)], {}, 1,
     ShapeInferenceError, "ratio that is not a constant"),
    ("dropout_training_not_constant", "Dropout", 13, [("float32", (B, 3)), ("float32", ()), ("bool", ())], [], {}, 1,
     UnsupportedAttributeError, "not a constant"),
    ("dropout_int", "Dropout", 13, [("int32", (B, 3))], [], {}, 1, UnsupportedAttributeError, "int32"),
    ("where_float_condition", "Where", 16, [("float32", (B, 3))], [np.ones(3, np.float32), np.ones(3, np.float32)], {}, 1,
     UnsupportedAttributeError, "condition"),
    ("where_dtype_mix", "Where", 16, [("bool", (B, 3))], [np.ones(3, np.float32), np.ones(3, I64)], {}, 1,
     ShapeInferenceError, "different dtypes"),
    ("pow7_dtype_mix", "Pow", 7, [("float32", (B, 3))], [np.ones(3, F64)], {}, 1, ShapeInferenceError, "different dtypes"),
    ("pow_int8_base", "Pow", 15, [("int8", (B, 3))], [np.ones(3, I8)], {}, 1, UnsupportedAttributeError, "base dtype int8"),
    ("pow_bool_exponent", "Pow", 15, [("float32", (B, 3))], [np.ones(3, BOOL)], {}, 1, UnsupportedAttributeError, "exponent"),
    ("pow_int_base_opset11", "Pow", 11, [("int32", (B, 3))], [np.ones(3, I32)], {}, 1, UnsupportedAttributeError, "int32"),
    ("erf_int_opset13", "Erf", 13, [("int32", (B, 3))], [], {}, 1, UnsupportedAttributeError, "int32"),
    ("sum_shapes_differ_opset6", "Sum", 7, [("float32", (B, 3))], [np.ones((1, 3), np.float32)], {}, 1,
     ShapeInferenceError, "opset 8"),
    ("sum_int", "Sum", 13, [("int64", (B, 3))], [], {}, 1, UnsupportedAttributeError, "int64"),
    ("clip_vector_min", "Clip", 13, [("float32", (B, 3))], [np.zeros(2, np.float32)], {}, 1, ShapeInferenceError, "scalars"),
    ("clip_int_opset11", "Clip", 11, [("int32", (B, 3))], [], {}, 1, UnsupportedAttributeError, "int32"),
    ("clip_bound_dtype", "Clip", 13, [("float32", (B, 3))], [f(0, F64)], {}, 1, ShapeInferenceError, "different dtypes"),
    ("hardswish_opset13", "HardSwish", 13, [("float32", (B, 3))], [], {}, 1, UnsupportedOpError, "needs opset 14 or later"),
    ("dropout_opset6", "Dropout", 6, [("float32", (B, 3))], [], {"is_test": 1}, 1, UnsupportedOpError, "or later"),
]


@pytest.mark.parametrize("id,op,opset,in_types,inits,attrs,n_out,error,fragment", BAD, ids=[b[0] for b in BAD])
def test_infer_rejects(id, op, opset, in_types, inits, attrs, n_out, error, fragment):
    # prepare
    inputs = [Value(f"x{i}", TensorType(dtype, shape)) for i, (dtype, shape) in enumerate(in_types)]
    names = {f"c{i}": a for i, a in enumerate(inits)}
    outs = ("y", "mask")[:n_out]
    node = Node("n0", op, (*[v.name for v in inputs], *names), outs, attrs, opset)
    # act / assert
    with pytest.raises(error, match=fragment) as info:
        build_graph(id, inputs, list(outs), [node], names, opset)
    assert "'n0'" in str(info.value)


FLOPS = [
    # id, op, opset, shapes, attrs, expected per hand
    ("sub", "Sub", 13, [(2, 3), (3,)], {}, 6),
    ("sum_three", "Sum", 13, [(2, 3), (3,), (2, 1)], {}, 2 * 6),
    ("exp", "Exp", 13, [(4, 5)], {}, 8 * 20),
    ("erf", "Erf", 13, [(4, 5)], {}, 20 * 20),
    ("gelu_none", "Gelu", 20, [(10,)], {}, 24 * 10),
    ("gelu_tanh", "Gelu", 20, [(10,)], {"approximate": "tanh"}, 15 * 10),
    ("dropout", "Dropout", 13, [(10,)], {}, 0),
]


@pytest.mark.parametrize("id,op,opset,shapes,attrs,expected", FLOPS, ids=[c[0] for c in FLOPS])
def test_flops(id, op, opset, shapes, attrs, expected):
    inputs = [Value(f"x{i}", TensorType("float32", s)) for i, s in enumerate(shapes)]
    node = Node("n0", op, tuple(v.name for v in inputs), ("y",), attrs, opset)
    graph = build_graph(id, inputs, ["y"], [node], {}, opset)
    assert ops.get(op).flops(node, [v.type for v in inputs], [graph.types["y"]]) == expected


# --- these ops are op-contract rows (one kernel, attrs() as keywords) ------------------

MIGRATED = ("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Equal", "Greater", "Less", "Not", "Where", "Tanh", "Exp", "Log",
            "Sqrt", "Erf", "LeakyRelu", "HardSigmoid", "Clip", "ReduceMax", "ReduceMean", "ReduceSum", "Cast",
            "Identity", "Dropout")


def test_elementwise_ops_are_table_rows():
    from cuvil_edge.ir.ops._contract import OpDef

    assert [op for op in MIGRATED if not isinstance(ops.get(op), OpDef)] == []


EMITS = [
    # id, op, opset, node inputs, node outputs, attrs, the call a compiled module makes (unspecialised)
    ("cast", "Cast", 13, ("x",), ("y",), {"to": 10}, "v9 = k_cast(v0, to='float16')"),
    ("leakyrelu", "LeakyRelu", 16, ("x",), ("y",), {"alpha": 0.2}, "v9 = k_leaky_relu(v0, alpha=0.2)"),
    ("hardsigmoid_defaults", "HardSigmoid", 6, ("x",), ("y",), {}, "v9 = k_hard_sigmoid(v0, alpha=0.2, beta=0.5)"),
    ("clip_attributes", "Clip", 7, ("x",), ("y",), {"min": -0.5},
     "v9 = k_clip(v0, lo=-0.5, hi=3.4028234663852886e+38)"),
    ("clip_max_input_only", "Clip", 13, ("x", "", "b"), ("y",), {}, "v9 = k_clip(v0, None, v2)"),
    ("reduce_sum_axes_attribute", "ReduceSum", 11, ("x",), ("y",), {"axes": [1], "keepdims": 0},
     "v9 = k_reduce_sum(v0, keepdims=False, noop=0, axes=(1,))"),
    ("reduce_sum_axes_input", "ReduceSum", 13, ("x", "a"), ("y",), {"noop_with_empty_axes": 1},
     "v9 = k_reduce_sum(v0, v1, keepdims=True, noop=1)"),
    ("reduce_max_axes_attribute_opset13", "ReduceMax", 13, ("x",), ("y",), {"axes": [-1]},
     "v9 = k_reduce_max(v0, keepdims=True, noop=0, axes=(-1,))"),
    ("reduce_mean_no_axes_opset18", "ReduceMean", 18, ("x",), ("y",), {}, "v9 = k_reduce_mean(v0, keepdims=True, noop=0)"),
    ("sum_three", "Sum", 13, ("x", "a", "b"), ("y",), {}, "v9 = k_sum(v0, v1, v2)"),
    ("where", "Where", 16, ("x", "a", "b"), ("y",), {}, "v9 = k_where(v0, v1, v2)"),
    ("dropout", "Dropout", 13, ("x",), ("y",), {}, "v9 = k_dropout(v0, mask='none')"),
    ("dropout_mask_opset10", "Dropout", 10, ("x",), ("y", "m"), {"ratio": 0.3}, "v9, v8 = k_dropout(v0, mask='false')"),
]


@pytest.mark.parametrize("id,op,opset,inputs,outputs,attrs,expected", EMITS, ids=[e[0] for e in EMITS])
def test_emitted_calls_name_their_attributes(id, op, opset, inputs, outputs, attrs, expected):
    node = Node("n0", op, inputs, outputs, attrs, opset)
    args = ["v0", "" if not inputs[1:2] or not inputs[1] else "v1", "v2"][:len(inputs)]
    assert ops.get(op).emit(node, args, ["v9", "v8"][:len(outputs)]) == expected


def _literal(value) -> bool:
    if isinstance(value, tuple):
        return all(_literal(v) for v in value)
    return value is None or type(value) in (int, float, bool, str)


#: One node per attribute branch of the migrated ops (attribute before / input after an opset...).
ATTR_NODES = [
    Node("n0", "Cast", ("x",), ("y",), {"to": 7}, 13),
    Node("n0", "LeakyRelu", ("x",), ("y",), {"alpha": 0.1}, 6),
    Node("n0", "HardSigmoid", ("x",), ("y",), {"alpha": 0.3, "beta": 0.4}, 22),
    Node("n0", "Clip", ("x",), ("y",), {"min": np.float32(-1.0), "max": 2}, 6),
    Node("n0", "Clip", ("x", "lo", "hi"), ("y",), {}, 13),
    *(Node("n0", op, ("x",), ("y",), {"axes": [0, -1], "keepdims": np.int64(0)}, 11)
      for op in ("ReduceMax", "ReduceMean", "ReduceSum")),
    *(Node("n0", op, ("x", "a"), ("y",), {"noop_with_empty_axes": 1}, 18) for op in ("ReduceMax", "ReduceMean")),
    Node("n0", "ReduceSum", ("x", "a"), ("y",), {"noop_with_empty_axes": 1}, 13),
    *(Node("n0", "Dropout", ("x",), outputs, {}, opset) for outputs in (("y",), ("y", ""), ("y", "m"))
      for opset in (7, 10, 12)),
]


@pytest.mark.parametrize("node", ATTR_NODES, ids=lambda n: f"{n.op_type}_opset{n.version}_{len(n.inputs)}in")
def test_attrs_are_literals_the_kernel_never_rebinds(node):
    """The code generator substitutes attrs() values into the kernel body (op contract rules 1, 2)."""
    import ast

    from cuvil_edge.ir.ops._contract import source_of

    op = ops.get(node.op_type)
    values = op.attrs(node)
    assert all(_literal(v) for v in values.values()), values
    tree = ast.parse(source_of(op.fn))
    rebound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    assert not rebound & set(values), rebound & set(values)


@pytest.mark.parametrize("opset,outputs,mask", [
    (7, ("y", "m"), np.zeros(3, np.float32)), (10, ("y", "m"), np.zeros(3, BOOL)), (12, ("y", "m"), np.ones(3, BOOL)),
    (13, ("y", ""), None), (13, ("y",), "absent"),
], ids=["zeros_opset7", "false_opset10", "true_opset12", "declared_unnamed", "no_mask_output"])
def test_dropout_mask_follows_the_opset_and_the_declared_outputs(opset, outputs, mask):
    # prepare
    node = Node("n0", "Dropout", ("x",), outputs, {}, opset)
    x = arr(1.5, -2.0, 3.0)
    dropout = ops.get("Dropout")
    # act
    interpreted = dropout.kernel(node, x)
    compiled = run_template(dropout, node, {"x": x}, {})
    # assert
    for got in (interpreted, compiled):
        assert len(got) == len(outputs) and got[0] is x
        if mask is None:
            assert got[1] is None
        elif not isinstance(mask, str):
            assert got[1].dtype == mask.dtype
            np.testing.assert_array_equal(got[1], mask)
