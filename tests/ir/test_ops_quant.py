"""Quantization ops (QuantizeLinear ... ConvInteger): interpreter and template vs onnxruntime, exact equality."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter, ops

from onnx_cases import In, const, run_ort, run_template

U8, I8, I32, F32 = np.uint8, np.int8, np.int32, np.float32


def f32(*v):
    return np.array(v, F32) if len(v) != 1 else np.array(v[0], F32)


def q(dtype, *v):
    return np.array(v, dtype) if len(v) != 1 else np.array(v[0], dtype)


def qconst(*shape, dtype=U8, seed=3):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed + sum(shape)).integers(info.min, info.max + 1, size=shape).astype(dtype)


# id, op, args (In = graph input, array = initializer), attrs, opset, output dtype
CASES = [
    ("quant_u8_scalar_opset10", "QuantizeLinear", [In((2, 7)), f32(0.05), q(U8, 128)], {}, 10, U8),
    ("quant_i8_no_zp_default_u8", "QuantizeLinear", [In((3, 5)), f32(0.1)], {}, 13, U8),
    ("quant_i8_per_axis", "QuantizeLinear", [In((2, 3, 4)), f32(0.05, 0.1, 0.2), q(I8, -3, 0, 5)], {"axis": 1}, 13, I8),
    ("quant_i8_neg_axis", "QuantizeLinear", [In((2, 3, 4)), f32(0.05, 0.1, 0.2, 0.3), q(I8, 1, 0, -1, 2)], {"axis": -1}, 19, I8),
    ("quant_output_dtype_int8", "QuantizeLinear", [In((4, 4)), f32(0.02)], {"output_dtype": 3}, 21, I8),
    ("quant_opset23", "QuantizeLinear", [In((4, 4)), f32(0.02), q(U8, 7)], {}, 23, U8),
    ("dequant_u8_opset10", "DequantizeLinear", [In((2, 7), U8), f32(0.05), q(U8, 128)], {}, 10, F32),
    ("dequant_i8_per_axis", "DequantizeLinear", [In((2, 3, 4), I8), f32(0.05, 0.1, 0.2), q(I8, -3, 0, 5)], {"axis": 1}, 13, F32),
    ("dequant_i32_no_zp", "DequantizeLinear", [In((5,), I32), f32(0.001)], {}, 13, F32),
    ("dequant_opset21", "DequantizeLinear", [In((3, 4), I8), f32(0.5), q(I8, 2)], {}, 21, F32),
    ("matmulinteger_u8_zps", "MatMulInteger", [In((3, 4), U8), qconst(4, 5), q(U8, 12), q(U8, 7)], {}, 10, I32),
    ("matmulinteger_i8_u8", "MatMulInteger", [In((2, 3, 4), U8), qconst(4, 2, dtype=I8), q(U8, 3)], {}, 10, I32),
    ("matmulinteger_per_col", "MatMulInteger", [In((3, 4), U8), qconst(4, 5), q(U8, 1), q(U8, 1, 2, 3, 4, 5)], {}, 10, I32),
    ("matmulinteger_no_zp", "MatMulInteger", [In((3, 4), I8), qconst(4, 5, dtype=I8)], {}, 10, I32),
    ("qlinearmatmul_u8", "QLinearMatMul", [In((3, 4), U8), f32(0.02), q(U8, 100), qconst(4, 5), f32(0.01), q(U8, 120),
                                           f32(0.03), q(U8, 110)], {}, 10, U8),
    ("qlinearmatmul_i8_3d_opset21", "QLinearMatMul", [In((2, 3, 4), I8), f32(0.05), q(I8, 1), qconst(4, 5, dtype=I8),
                                                      f32(0.04), q(I8, -2), f32(0.2), q(I8, 3)], {}, 21, I8),
    ("qlinearmatmul_saturates", "QLinearMatMul", [In((3, 8), U8), f32(1.0), q(U8, 0), qconst(8, 2), f32(1.0), q(U8, 0),
                                                  f32(0.5), q(U8, 0)], {}, 10, U8),
    ("convinteger_pads", "ConvInteger", [In((1, 2, 5, 5), U8), qconst(3, 2, 3, 3), q(U8, 100), q(U8, 120)],
     {"pads": [1, 1, 1, 1]}, 10, I32),
    ("convinteger_strides_group", "ConvInteger", [In((2, 4, 6, 6), U8), qconst(4, 2, 3, 3), q(U8, 9)],
     {"strides": [2, 2], "group": 2}, 10, I32),
    ("convinteger_no_zp_i8w", "ConvInteger", [In((1, 2, 5, 5), U8), qconst(3, 2, 2, 2, dtype=I8)], {}, 10, I32),
    ("qlinearconv_u8_bias", "QLinearConv", [In((1, 2, 5, 5), U8), f32(0.02), q(U8, 100), qconst(3, 2, 3, 3), f32(0.01),
                                            q(U8, 120), f32(0.05), q(U8, 110), q(I32, 100, -200, 300)],
     {"pads": [1, 1, 1, 1]}, 10, U8),
    ("qlinearconv_i8_per_channel", "QLinearConv", [In((2, 2, 6, 6), I8), f32(0.05), q(I8, 1), qconst(4, 2, 3, 3, dtype=I8),
                                                   f32(0.01, 0.02, 0.03, 0.04), q(I8, 0, 0, 0, 0), f32(0.1), q(I8, -5)],
     {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, 10, I8),
    ("qlinearconv_depthwise", "QLinearConv", [In((1, 3, 5, 5), U8), f32(0.02), q(U8, 128), qconst(3, 1, 3, 3), f32(0.01),
                                              q(U8, 128), f32(0.01), q(U8, 128)], {"group": 3}, 10, U8),
]


def build(case):
    _, op, args, attrs, opset, out_dtype = case
    inputs, inits, names = [], [], []
    for i, a in enumerate(args):
        names.append(f"in{i}")
        if isinstance(a, In):
            inputs.append(helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(np.dtype(a.dtype)), a.shape))
        else:
            inits.append(numpy_helper.from_array(a, f"in{i}"))
    node = helper.make_node(op, names, ["y"], name="n0", **attrs)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), None)
    model = helper.make_model(helper.make_graph([node], case[0], inputs, [out], inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model)
    model.graph.output[0].type.tensor_type.shape.SetInParent()  # rank unknown when inference could not tell
    return model.SerializeToString()


def feeds(case, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i, a in enumerate(case[2]):
        if isinstance(a, In):
            if np.dtype(a.dtype).kind == "f":
                out[f"in{i}"] = (rng.normal(size=a.shape) * 4).astype(a.dtype)
                out[f"in{i}"].flat[:4] = [0.025, -0.075, 0.125, 1e6][: out[f"in{i}"].size]  # ties and saturation
            else:
                info = np.iinfo(a.dtype)
                out[f"in{i}"] = rng.integers(max(info.min, -2**20), min(info.max, 2**20) + 1, size=a.shape).astype(a.dtype)
    return out


def test_cases_cover_quant_ops():
    assert {c[1] for c in CASES} == {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                                     "MatMulInteger", "ConvInteger"} <= set(ops.supported_ops())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_interpreter_matches_onnxruntime(case):
    # prepare
    model, x = build(case), feeds(case)
    expected = run_ort(model, x)
    # act
    actual = interpreter.run(load_model(model), x)["y"]
    # assert
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=0)
    else:
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("large_scratch", [True, False], ids=["large_scratch", "low_memory"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_template_matches_interpreter(case, large_scratch):
    # prepare
    model, x = build(case), feeds(case)
    graph = load_model(model)
    (node,) = graph.nodes
    # act: the call a compiled module makes (op-contract kernels: a copy specialised for the node)
    (actual,) = run_template(ops.get(node.op_type), node, {**graph.initializers, **x},
                             {"TARGET_LARGE_SCRATCH": large_scratch})
    # assert
    expected = interpreter.run(graph, x)["y"]
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("case_id,flops,macs", [
    ("matmulinteger_u8_zps", 2 * 60, 60),  # (3x4) @ (4x5): 60 multiply-adds
    ("matmulinteger_i8_u8", 2 * 48, 48),  # batch 2 of (3x4) @ (4x2)
    ("qlinearmatmul_u8", 2 * 60 + 3 * 15, 60),  # + scale, round and zero point per output
])
def test_quantized_matmuls_count_their_multiply_adds(case_id, flops, macs):
    from cuvil_edge.ir.cost import total_flops, total_macs

    graph = load_model(build(next(c for c in CASES if c[0] == case_id)))
    assert (total_flops(graph), total_macs(graph)) == (flops, macs)


REJECT = [
    ("blocked", "QuantizeLinear", [In((4, 4)), f32(0.1) * np.ones((4, 2), F32), q(U8, 0) * np.ones((4, 2), U8)],
     {"axis": 1, "block_size": 2}, 21, U8, "blocked"),
    ("int16_zero_point", "QuantizeLinear", [In((4, 4)), f32(0.1), q(np.int16, 0)], {}, 21, np.int16, "int16"),
    ("float8_output_dtype", "QuantizeLinear", [In((4, 4)), f32(0.1)], {"output_dtype": 17}, 21, U8, "output_dtype 17"),
    ("dequant_int16", "DequantizeLinear", [In((4,), np.int16), f32(0.1)], {}, 21, F32, "int16"),
    ("matmulinteger_int32", "MatMulInteger", [In((2, 2), U8), q(I32, [[1, 2], [3, 4]])], {}, 10, I32, "int32"),
]


@pytest.mark.parametrize("case", REJECT, ids=[c[0] for c in REJECT])
def test_unsupported_quantization_is_rejected_naming_the_node(case):
    model = onnx.load_from_string(build(case[:6]))
    with pytest.raises(UnsupportedAttributeError, match=f"n0.*{case[6]}|{case[6]}.*n0"):
        load_model(model)
