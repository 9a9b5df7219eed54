"""Typed errors for hostile graphs: one row per root cause that the structured
fuzzer (tests/ir_serialize/fuzz_structured.py) found.  Every input gets a CuvilError of the
expected leaf type, raised on purpose (no foreign exception in its cause chain), and build-time
constant folding never runs a kernel whose work or temporaries are unbounded."""

from __future__ import annotations

import sys
from pathlib import Path

import dataclasses

import numpy as np
import pytest

from cuvil_edge.errors import (
    CuvilError, MalformedModelError, PackageError, PackageFormatError, ShapeInferenceError, UnsupportedAttributeError,
)
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir import ops, shape_values
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph, known_values

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ir_serialize"))
import fuzz_structured  # noqa: E402  (encode, sign, check: the signed-package path under test)

I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
F32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731


def _foreign(e: BaseException) -> list[str]:
    """Non-cuvil exceptions in the cause/context chain: a safety net caught them, not a check."""
    return [type(x).__name__ for x in fuzz_structured._chain(e) if not isinstance(x, CuvilError)]


# --- through a correctly signed package ------------------------------------------------------


def _header(node: dict, x_shape, y_shape, extra_inputs=()) -> dict:
    return {"name": "g", "opset": 13, "inputs": [{"name": "x", "dtype": "float32", "shape": list(x_shape)}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": list(y_shape)}],
            "nodes": [{"name": "n", "outputs": ["y"], "attrs": {}, "version": 13, "inputs": ["x", *extra_inputs],
                       **node}], "initializers": []}


def _f16_inf_tensor():
    return {"tensor": {"dtype": "float16", "shape": [], "values": [1e5]}}


PACKAGES = [
    # (id, header graph, initializers, expected leaf type of the PackageError's cause, message fragment)
    ("squeeze_axes_attr_2_63", _header({"op": "Squeeze", "version": 11, "attrs": {"axes": [2**63]}}, (1, 3, 1), (1, 3)),
     {}, None, "outside int64"),
    ("squeeze_axes_float16_initializer_1e5", _header({"op": "Squeeze"}, (1, 3, 1), (1, 3), ["axes"]),
     {"axes": np.full(1, np.inf, np.float16)}, ShapeInferenceError, "1-D integer vector"),  # 1e5 in float16 is inf
    ("gather_axis_float16_inline_1e5", _header({"op": "Gather", "attrs": {"axis": _f16_inf_tensor()}}, (3,), (3,),
                                               ["i"]), {"i": I64(0, 1, 2)}, None, "fit float16"),
    ("inline_uint8_value_minus_1", _header({"op": "ConstantOfShape", "inputs": ["s"],
                                            "attrs": {"value": {"tensor": {"dtype": "uint8", "shape": [1],
                                                                           "values": [-1]}}}}, (1,), (2,)),
     {"s": I64(2)}, None, "fit uint8"),
    ("inline_shape_product_wraps_int64", _header({"op": "ConstantOfShape", "inputs": ["s"],
                                                  "attrs": {"value": {"tensor": {"dtype": "float32", "shape": [1024] * 7,
                                                                                 "values": []}}}}, (1,), (2,)),
     {"s": I64(2)}, None, "values"),
    ("concat_axis_list", _header({"op": "Concat", "attrs": {"axis": [0, -2**63]}}, (2,), (2,)), {},
     UnsupportedAttributeError, "must be an int64"),
    ("resize_scales_inf", _header({"op": "Resize", "inputs": ["x", "", "sc"]}, (1, 1, 2, 2), (1, 1, 4, 4)),
     {"sc": F32(1, 1, np.inf, 2)}, ShapeInferenceError, "positive, finite"),
]


@pytest.mark.parametrize("graph,arrays,cause,fragment", [p[1:] for p in PACKAGES], ids=[p[0] for p in PACKAGES])
def test_signed_package_with_hostile_graph_gets_a_typed_error(graph, arrays, cause, fragment):
    # prepare
    graph["initializers"] = sorted(arrays)
    data = fuzz_structured.sign(fuzz_structured.encode(graph, arrays))
    # act
    with pytest.raises(PackageError) as info:
        fuzz_structured.check(data)
    # assert
    assert isinstance(info.value, PackageFormatError)
    assert fragment in str(info.value)
    assert _foreign(info.value) == []
    if cause is not None:
        assert isinstance(info.value.__cause__, cause)


# --- build_graph: one row per root cause ------------------------------------------------------


def _x(*shape, dtype="float32"):
    return Value("x", TensorType(dtype, shape))


BAD = [
    # (id, inputs, nodes, initializers, error, message fragment)
    # attribute kinds are checked against the op's ATTRS table before its infer reads them
    ("concat_axis_tuple", [_x(2)], [Node("n", "Concat", ("x",), ("y",), {"axis": (0,)})], {},
     UnsupportedAttributeError, "'axis' must be an int64"),
    ("reduce_keepdims_string", [_x(2, 3)], [Node("n", "ReduceSum", ("x",), ("y",), {"keepdims": "VALID"})], {},
     UnsupportedAttributeError, "'keepdims' must be an int64"),
    ("layernorm_epsilon_list", [_x(2, 3)], [Node("n", "LayerNormalization", ("x", "s"), ("y",), {"epsilon": ()},
                                                 17)], {"s": F32(1, 1, 1)}, UnsupportedAttributeError, "'epsilon'"),
    ("softmax_axis_bool", [_x(2, 3)], [Node("n", "Softmax", ("x",), ("y",), {"axis": True})], {},
     UnsupportedAttributeError, "'axis' must be an int64"),
    ("flatten_axis_float", [_x(2, 3)], [Node("n", "Flatten", ("x",), ("y",), {"axis": 1.5})], {},
     UnsupportedAttributeError, "'axis'"),
    ("cast_to_bool", [_x(2)], [Node("n", "Cast", ("x",), ("y",), {"to": True})], {},
     UnsupportedAttributeError, "'to'"),
    ("transpose_perm_mixed", [_x(2, 3)], [Node("n", "Transpose", ("x",), ("y",), {"perm": (1, "0")})], {},
     UnsupportedAttributeError, "list of int64"),
    ("pool_auto_pad_int", [_x(1, 1, 4, 4)], [Node("n", "MaxPool", ("x",), ("y",), {"kernel_shape": (2, 2),
                                                                                   "auto_pad": 3})], {},
     UnsupportedAttributeError, "'auto_pad' must be a string"),
    ("attr_int_over_int64", [_x(2, 3)], [Node("n", "Gather", ("x", "i"), ("y",), {"axis": 2**63})], {"i": I64(0)},
     UnsupportedAttributeError, "int64"),
    # ConvTranspose output_shape shorter than the spatial rank (was IndexError)
    ("convtranspose_output_shape_short", [_x(1, 1, 3, 3)],
     [Node("n", "ConvTranspose", ("x", "w"), ("y",), {"output_shape": (10,)})], {"w": np.ones((1, 1, 2, 2), np.float32)},
     ShapeInferenceError, "output_shape"),
    ("convtranspose_huge_stride_accumulator", [_x(1, 1, 3, 3)],
     [Node("n", "ConvTranspose", ("x", "w"), ("y",), {"strides": (3, 2**62), "output_shape": (4, 4)})],
     {"w": np.ones((1, 1, 2, 2), np.float32)}, ShapeInferenceError, "accumulator"),
    ("convtranspose_huge_output_padding", [_x(1, 1, 3, 3)],
     [Node("n", "ConvTranspose", ("x", "w"), ("y",), {"output_padding": (1, 2**31), "output_shape": (4, 4)})],
     {"w": np.ones((1, 1, 2, 2), np.float32)}, ShapeInferenceError, "accumulator"),
    ("convtranspose_empty_kernel", [_x(1, 1, 3, 3)], [Node("n", "ConvTranspose", ("x", "w"), ("y",))],
     {"w": np.ones((1, 0, 3, 2), np.float32)}, ShapeInferenceError, "empty"),
    # zero strides with auto_pad SAME (was ZeroDivisionError)
    ("pool_zero_stride_same_upper", [_x(1, 1, 4, 4)],
     [Node("n", "MaxPool", ("x",), ("y",), {"kernel_shape": (2, 2), "strides": (0, 2), "auto_pad": "SAME_UPPER"})],
     {}, ShapeInferenceError, "non-positive strides"),
    # Split without outputs (was ZeroDivisionError)
    ("split_without_outputs", [_x(4)], [Node("n", "Split", ("x",), ())], {}, ShapeInferenceError, "no outputs"),
    # Resize scales that give no valid shape (was OverflowError from float infinity)
    ("resize_scales_nan", [_x(1, 1, 2, 2)], [Node("n", "Resize", ("x", "", "sc"), ("y",))],
     {"sc": F32(1, 1, np.nan, 1)}, ShapeInferenceError, "positive, finite"),
    ("resize_scales_negative", [_x(1, 1, 2, 2)], [Node("n", "Resize", ("x", "", "sc"), ("y",))],
     {"sc": F32(1, 1, -2, 1)}, ShapeInferenceError, "positive, finite"),
    ("resize_scales_huge", [_x(1, 1, 2, 2)], [Node("n", "Resize", ("x", "", "sc"), ("y",))],
     {"sc": F32(1, 1, 3e38, 1)}, ShapeInferenceError, "positive, finite"),
    ("resize_scales_2d", [_x(1, 1, 2, 2)], [Node("n", "Resize", ("x", "", "sc"), ("y",))],
     {"sc": np.ones((4, 1), np.float32)}, ShapeInferenceError, "1-D float vector"),
    ("resize_policy_on_empty_axis", [_x(1, 1, 0, 2)],
     [Node("n", "Resize", ("x", "", "", "sz"), ("y",), {"keep_aspect_ratio_policy": "not_larger"}, 18)],
     {"sz": I64(1, 1, 0, 4)}, ShapeInferenceError, "non-empty axes"),
    ("resize_empty_axis_to_non_empty", [_x(1, 1, 0, 2)], [Node("n", "Resize", ("x", "", "", "sz"), ("y",))],
     {"sz": I64(1, 1, 4, 4)}, ShapeInferenceError, "empty axis"),
    ("resize_crop_roi_wrong_shape", [_x(1, 1, 2, 2)],
     [Node("n", "Resize", ("x", "roi", "sc"), ("y",), {"coordinate_transformation_mode": "tf_crop_and_resize"})],
     {"roi": np.zeros((1, 1), np.uint64), "sc": F32(1, 1, 2, 2)}, ShapeInferenceError, "roi"),
    # Pad cropping more than the axis holds (infer and kernel disagreed)
    ("pad_crop_past_axis", [_x(5)], [Node("n", "Pad", ("x", "p"), ("y",))], {"p": I64(2**31, -2**31)},
     ShapeInferenceError, "do not fit axis"),
    ("pad_value_dtype", [_x(5, dtype="int32")], [Node("n", "Pad", ("x", "p", "v"), ("y",))],
     {"p": I64(1, 1), "v": np.array(np.nan)}, ShapeInferenceError, "constant_value"),
    # non-positive window sizes (kernel failed on them)
    ("pool_kernel_negative", [_x(1, 1, 4, 4)], [Node("n", "AveragePool", ("x",), ("y",), {"kernel_shape": (3, -3)})],
     {}, ShapeInferenceError, "at least 1"),
    # 0-d shape/axes vectors (the kernels take 1-D ones)
    ("unsqueeze_axes_0d", [_x(2)], [Node("n", "Unsqueeze", ("x", "a"), ("y",))], {"a": np.array(0, np.int64)},
     ShapeInferenceError, "1-D integer vector"),
    ("expand_shape_0d", [_x(2)], [Node("n", "Expand", ("x", "s"), ("y",))], {"s": np.array(2, np.int64)},
     ShapeInferenceError, "1-D integer vector"),
    # LayerNormalization scale / bias not checked against X
    ("layernorm_scale_shape", [_x(3, 4)], [Node("n", "LayerNormalization", ("x", "s"), ("y",), {}, 17)],
     {"s": F32(1, 2, 3)}, ShapeInferenceError, "broadcast"),
    ("layernorm_bias_dtype", [_x(3, 4)], [Node("n", "LayerNormalization", ("x", "s", "b"), ("y",), {}, 17)],
     {"s": F32(1, 2, 3, 4), "b": I64(1, 2, 3, 4)}, ShapeInferenceError, "must be float32"),
    # Dropout's ratio / training_mode must be scalars (an empty one was IndexError)
    ("dropout_training_mode_empty", [_x(2)], [Node("n", "Dropout", ("x", "", "t"), ("y",))],
     {"t": np.zeros(0, bool)}, ShapeInferenceError, "must be a scalar"),
    # absurd element counts and ranks are malformed (no tensor of 2^62 elements, no rank 65)
    ("constant_of_shape_2_62_elements", [_x(1)], [Node("n", "ConstantOfShape", ("s",), ("y",))],
     {"s": I64(2**31 - 1, 2**31 - 1)}, MalformedModelError, "elements"),
    ("reshape_rank_65", [_x(1)], [Node("n", "Reshape", ("x", "s"), ("y",))], {"s": np.ones(65, np.int64)},
     MalformedModelError, "rank 65"),
]


@pytest.mark.parametrize("inputs,nodes,inits,error,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_build_graph_rejects_with_a_typed_error(inputs, nodes, inits, error, fragment):
    # act
    with pytest.raises(error) as info:
        build_graph("g", inputs, [o for n in nodes for o in n.outputs][:1] or ["x"], nodes, inits, 13)
    # assert
    assert fragment in str(info.value)
    assert _foreign(info.value) == []


def test_attribute_kinds_accept_what_the_frontend_and_passes_produce():
    # prepare: numpy integers and floats, ints for floats, bytes for strings
    nodes = [Node("g", "Gemm", ("x", "w"), ("h",), {"alpha": 1, "beta": np.float32(0.5), "transB": np.int64(1)}),
             Node("s", "Softmax", ("h",), ("y",), {"axis": np.int32(-1)})]
    # act
    g = build_graph("g", [_x(2, 3)], ["y"], nodes, {"w": np.ones((4, 3), np.float32)}, 13)
    # assert
    assert g.types["y"] == TensorType("float32", (2, 4))


# --- build-time folding stays bounded ----------------------------------------------------------

FOLDS = [
    # (id, nodes, initializers): the kernel must not run at build time
    # a node without declared outputs still computes them all (was: 48 GiB ConstantOfShape)
    ("undeclared_outputs", [Node("n", "ConstantOfShape", ("s",), ())], {"s": I64(2**31, 6)}),
    # an empty tensor with a huge dim (was: 8 GiB temporary in Softmax)
    ("empty_tensor_huge_dim", [Node("n", "Softmax", ("c",), ("y",), {"axis": 0})],
     {"c": np.zeros((0, 2**31 - 1), np.float32)}),
    # a huge window on a small input (was: a 792 GiB padded temporary in AveragePool)
    ("huge_window", [Node("n", "AveragePool", ("c",), ("y",), {"kernel_shape": (2, 2**31), "auto_pad": "SAME_UPPER"})],
     {"c": np.ones((1, 3, 32, 32), np.float32)}),
]


@pytest.mark.parametrize("nodes,inits", [f[1:] for f in FOLDS], ids=[f[0] for f in FOLDS])
def test_build_time_folding_skips_unbounded_kernels(monkeypatch, nodes, inits):
    # prepare: record kernel calls (an exception would be swallowed by the folding net)
    module, calls = ops.get(nodes[0].op_type), []
    recorder = lambda *a, **k: calls.append(a) or None  # noqa: E731
    if isinstance(module, OpDef):  # frozen: register a copy whose kernel records
        monkeypatch.setitem(ops.registry(), nodes[0].op_type, dataclasses.replace(module, fn=recorder))
    else:
        monkeypatch.setattr(module, "kernel", lambda *a, **k: calls.append(a) or [None])
    outputs = [o for n in nodes for o in n.outputs] or ["x"]
    # act
    g = build_graph("g", [_x(1)], outputs, nodes, inits, 13)
    # assert
    assert calls == []
    assert all(o not in known_values(g) for o in outputs if o != "x")


def test_small_constants_are_still_folded():
    # prepare
    nodes = [Node("n", "ConstantOfShape", ("s",), ("y",)), Node("a", "AveragePool", ("c",), ("z",), {"kernel_shape": (2, 2)})]
    inits = {"s": I64(2, 3), "c": np.ones((1, 1, 4, 4), np.float32)}
    # act
    values = known_values(build_graph("g", [_x(1)], ["y", "z"], nodes, inits, 13))
    # assert
    np.testing.assert_array_equal(values["y"], np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(values["z"], np.ones((1, 1, 3, 3), np.float32))


# --- the last-resort net -----------------------------------------------------------------------


@pytest.mark.parametrize("exc", [OverflowError("int too large"), MemoryError(), RecursionError(), KeyError("k")])
def test_unexpected_inference_failure_becomes_shape_inference_error_naming_the_node(monkeypatch, exc):
    # prepare: an op whose infer fails by mistake
    def broken(node, inputs):
        raise exc

    monkeypatch.setitem(ops.registry(), "Tanh", dataclasses.replace(ops.get("Tanh"), infer=broken))  # OpDef: frozen
    # act
    with pytest.raises(ShapeInferenceError) as info:
        build_graph("g", [_x(2)], ["y"], [Node("act", "Tanh", ("x",), ("y",))], {}, 13)
    # assert
    assert "node 'act' (Tanh)" in str(info.value) and type(exc).__name__ in str(info.value)
    assert info.value.__cause__ is exc


def test_symbolic_rule_overflow_leaves_the_value_unknown(monkeypatch):
    # prepare: a shape rule that overflows on a hostile value gives "unknown", not an exception
    def overflowing(node, values, types):
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setitem(shape_values.SYMBOLIC, "Identity", overflowing)
    nodes = [Node("s", "Shape", ("x",), ("s1",)), Node("i", "Identity", ("s1",), ("y",))]
    # act
    g = build_graph("g", [Value("x", TensorType("float32", ("batch", 2)))], ["y"], nodes, {}, 13)
    # assert
    assert "y" not in known_values(g)
