"""Elementwise ops of two or more inputs with numpy (multidirectional) broadcasting, one table row
each (the op contract: ``_contract.py``): the arithmetic Add, Sub, Mul, Div, Pow; the variadic Sum,
Min, Max, Mean; the comparisons Equal, Greater, Less, GreaterOrEqual, LessOrEqual (bool output);
Where (three inputs); Mod, And, Or, Xor, the bitwise ops, BitShift and PRelu.

Integer arithmetic wraps (two's complement, as onnxruntime); integer Div truncates toward zero as C
does (-7 / 2 = -3); float division by zero gives inf or NaN. Comparisons with NaN are False.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, broadcast_scratch, no_scratch, per_element
from cuvil_edge.ir.ops._elementwise import (
    ALL,
    ARITH_14,
    ARITH_OLD,
    FLOATS,
    INTS,
    NUMERIC,
    TRANSCENDENTAL,
    broadcast_all,
    infer_binary,
    infer_unary,
    want,
)
from cuvil_edge.ir.ops._util import INT, STR, broadcast, choice, need, same_dtype

UNSIGNED = frozenset({"uint8", "uint16", "uint32", "uint64"})


# --- kernels ----------------------------------------------------------------------------------
def k_add(a, b):
    return np.asarray(np.add(a, b))


def k_sub(a, b):
    with np.errstate(all="ignore"):
        return np.asarray(np.subtract(a, b))


def k_mul(a, b):
    return np.asarray(np.multiply(a, b))


def k_div(a, b):
    with np.errstate(all="ignore"):
        if a.dtype.kind == "f":
            return np.asarray(np.divide(a, b))
        q = np.floor_divide(a, b)
        if a.dtype.kind == "i":  # floor to truncation: +1 where the signs differ and b does not divide a
            q = q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
        return np.asarray(q)


def k_pow(x, y):
    # C's pow on doubles, converted to x's dtype (integers truncate toward zero: 2 ** -1 = 0), as onnxruntime
    with np.errstate(all="ignore"):
        z = np.power(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
        return np.asarray(z.astype(x.dtype))


def k_sum(*xs):
    y = xs[0]
    with np.errstate(all="ignore"):
        for x in xs[1:]:  # left to right
            y = np.add(y, x)
    return np.asarray(y)


def k_equal(a, b):
    return np.asarray(np.equal(a, b))


def k_greater(a, b):
    return np.asarray(np.greater(a, b))


def k_greater_or_equal(a, b):
    return np.asarray(np.greater_equal(a, b))


def k_less_or_equal(a, b):
    return np.asarray(np.less_equal(a, b))


def k_less(a, b):
    return np.asarray(np.less(a, b))


def k_where(condition, x, y):
    return np.asarray(np.where(condition, x, y))


def k_min(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.minimum(out, x)
    return np.asarray(out)


def k_max(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.maximum(out, x)
    return np.asarray(out)


def k_mean(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return np.asarray(out / out.dtype.type(len(xs)))


def k_mod(a, b, fmod):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.fmod(a, b) if fmod else np.mod(a, b))  # fmod: sign of a; else sign of b


def k_and(a, b):
    return np.logical_and(a, b)


def k_or(a, b):
    return np.logical_or(a, b)


def k_xor(a, b):
    return np.logical_xor(a, b)


def k_bitwise_and(a, b):
    return np.asarray(np.bitwise_and(a, b))


def k_bitwise_or(a, b):
    return np.asarray(np.bitwise_or(a, b))


def k_bitwise_xor(a, b):
    return np.asarray(np.bitwise_xor(a, b))


def k_bitwise_not(x):
    return np.invert(x)


def k_bit_shift(x, y, left):
    # opset 28 defines shifts outside [0, bit width): 0 to the left; the sign to the right
    x, y = np.broadcast_arrays(x, y)
    outside = (y < 0) | (y >= 8 * x.dtype.itemsize)
    unsigned = np.dtype(f"u{x.dtype.itemsize}")
    shift = np.where(outside, 0, y).astype(unsigned)
    if left:
        shifted = np.left_shift(x.view(unsigned), shift).view(x.dtype)
        return np.where(outside, x.dtype.type(0), shifted)
    fill = np.where(x < 0, x.dtype.type(-1), x.dtype.type(0)) if x.dtype.kind == "i" else x.dtype.type(0)
    return np.where(outside, fill, np.right_shift(x, shift.astype(x.dtype))).astype(x.dtype)


def k_prelu(x, slope, per_channel):
    if per_channel and slope.ndim == 1 and slope.size > 1:  # before opset 7: one slope per channel (axis 1)
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return np.where(x < 0, x * slope, x).astype(x.dtype)


# --- inference --------------------------------------------------------------------------------
def _variadic(table, broadcast_since=None):
    """One or more same-dtype inputs, broadcast (from opset ``broadcast_since``: before it, one shape)."""

    def infer(node, inputs):
        if not inputs or any(t is None for t in inputs):
            raise ShapeInferenceError(f"{node.describe()} needs at least one input, none absent")
        dtype = same_dtype(node, inputs)
        want(node, inputs[0], table)
        if broadcast_since and node.version < broadcast_since and len({t.shape for t in inputs}) > 1:
            raise ShapeInferenceError(
                f"{node.describe()} at opset {node.version} needs inputs of one shape, "
                f"got {[str(t) for t in inputs]}; broadcasting needs opset {broadcast_since}"
            )
        return [TensorType(dtype, broadcast_all(node, [t.shape for t in inputs]))]

    return infer


def _binary(table, out_dtype=None):
    def infer(node, inputs):
        return infer_binary(node, inputs, table, out_dtype)

    return infer


def _compare(table):
    """The comparison family: two same-dtype inputs, broadcast; a bool output."""
    return _binary(table, out_dtype="bool")


def _infer_pow(node, inputs):
    """Opset 7: float base and exponent of one dtype; 12: int32/int64 base, any int or float exponent."""
    need(node, inputs, 2)
    if node.version < 12:
        same_dtype(node, inputs)
    want(node, inputs[0], ((7, FLOATS), (12, FLOATS | {"int32", "int64"})), "base")
    want(node, inputs[1], ((7, FLOATS), (12, FLOATS | INTS)), "exponent")
    return [TensorType(inputs[0].dtype, broadcast(node, inputs[0].shape, inputs[1].shape))]


def _infer_where(node, inputs):
    need(node, inputs, 3)
    want(node, inputs[0], _BOOL_9, "condition")
    dtype = same_dtype(node, inputs[1:])
    want(node, inputs[1], ((9, ALL),))
    return [TensorType(dtype, broadcast_all(node, [t.shape for t in inputs]))]


def _sum_flops(node, inputs, outputs):
    return (len(inputs) - 1) * outputs[0].numel()


def _infer_mod(node, inputs):
    out = infer_binary(node, inputs, ((10, NUMERIC),))
    if out[0].dtype in FLOATS and not int(node.attr("fmod", 0)) and node.version < 28:
        raise UnsupportedAttributeError(f"{node.describe()}: Mod of {out[0].dtype} needs fmod=1 before opset 28")
    return out


def _infer_prelu(node, inputs):
    need(node, inputs, 2)
    x, slope = inputs
    same_dtype(node, inputs)
    want(node, x, ((6, FLOATS), (9, FLOATS | {"int32", "int64", "uint32", "uint64"})))
    if node.version < 7 and slope.rank == 1 and x.rank >= 2 and slope.shape[0] == x.shape[1]:
        return [x]  # one slope per channel
    if broadcast_all(node, [x.shape, slope.shape]) != tuple(x.shape):
        raise ShapeInferenceError(f"{node.describe()}: slope {slope} must broadcast to X {x} (unidirectional)")
    return [x]


def _shift_attrs(node):
    return {"left": choice(node, "direction", "", ("LEFT", "RIGHT")) == "LEFT"}


_BOOL = ((7, frozenset({"bool"})),)
_BOOL_9 = ((9, frozenset({"bool"})),)
_BITS = ((18, INTS),)
#: Add/Sub/Mul/Div: 13 adds bfloat16 (not an IR dtype); 14 adds int8/int16/uint8/uint16.
_ARITH = ((7, ARITH_OLD), (14, ARITH_14))
_ORDERED = ((7, FLOATS), (9, FLOATS | INTS))  # Greater/Less: 9 adds integers, 13 bfloat16

OPS = (
    OpDef(
        "Add",
        (7, 13, 14),
        infer=_binary(_ARITH),
        fn=k_add,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a + b,
    ),
    OpDef(
        "Sub",
        (7, 13, 14),
        infer=_binary(_ARITH),
        fn=k_sub,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a - b,
    ),
    OpDef(
        "Mul",
        (7, 13, 14),
        infer=_binary(_ARITH),
        fn=k_mul,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a * b,
    ),
    OpDef(
        "Div",
        (7, 13, 14),
        infer=_binary(_ARITH),
        fn=k_div,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=_torch.div,
    ),
    # 13, 15: bfloat16 only; exp(y * log(x)): two transcendentals
    OpDef(
        "Pow",
        (7, 12, 13, 15),
        infer=_infer_pow,
        fn=k_pow,
        flops=per_element(2 * TRANSCENDENTAL),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: t.pow(a, b).to(a.dtype),
    ),
    # 6: inputs of one shape, 8: broadcast, 13: bfloat16 only; N inputs: N - 1 additions per element
    OpDef(
        "Sum",
        (6, 8, 13),
        batch="broadcast",
        infer=_variadic(((6, FLOATS),), broadcast_since=8),
        fn=k_sum,
        flops=_sum_flops,
        torch=_torch.variadic("add"),
    ),
    # Equal: 7 bool/int32/int64, 11 all, 13 bfloat16 and 19 string (not IR dtypes)
    OpDef(
        "Equal",
        (7, 11, 13, 19),
        infer=_compare(((7, frozenset({"bool", "int32", "int64"})), (11, ALL))),
        fn=k_equal,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a == b,
    ),
    OpDef(
        "Greater",
        (7, 9, 13),
        infer=_compare(_ORDERED),
        fn=k_greater,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a > b,
    ),
    OpDef(
        "Less",
        (7, 9, 13),
        infer=_compare(_ORDERED),
        fn=k_less,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a < b,
    ),
    # GreaterOrEqual/LessOrEqual: from 12 with every numeric type; 16 adds bfloat16
    OpDef(
        "GreaterOrEqual",
        (12, 16),
        infer=_compare(((12, FLOATS | INTS),)),
        fn=k_greater_or_equal,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
    ),
    OpDef(
        "LessOrEqual",
        (12, 16),
        infer=_compare(((12, FLOATS | INTS),)),
        fn=k_less_or_equal,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
    ),
    OpDef(
        "Where",
        (9, 16),
        infer=_infer_where,
        fn=k_where,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, c, a, b: t.where(c, a, b),
    ),  # 16 adds bfloat16 only
    OpDef(
        "Min",
        (6, 8, 12, 13),
        infer=_variadic(((6, FLOATS), (12, NUMERIC))),
        fn=k_min,
        flops=per_element(1),
        torch=_torch.variadic("minimum"),
    ),
    OpDef(
        "Max",
        (6, 8, 12, 13),
        infer=_variadic(((6, FLOATS), (12, NUMERIC))),
        fn=k_max,
        flops=per_element(1),
        torch=_torch.variadic("maximum"),
    ),
    OpDef("Mean", (6, 8, 13), infer=_variadic(((6, FLOATS),)), fn=k_mean, flops=per_element(1), torch=_torch.mean),
    OpDef(
        "Mod",
        (10, 13, 28),
        infer=_infer_mod,
        fn=k_mod,
        flops=per_element(1),
        attrs=lambda node: {"fmod": int(node.attr("fmod", 0))},
        ATTRS={"fmod": INT},
        torch=_torch.mod,
        scratch=broadcast_scratch,
    ),
    OpDef(
        "And",
        (7,),
        infer=_binary(_BOOL),
        fn=k_and,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a & b,
    ),
    OpDef(
        "Or",
        (7,),
        infer=_binary(_BOOL),
        fn=k_or,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a | b,
    ),
    OpDef(
        "Xor",
        (7,),
        infer=_binary(_BOOL),
        fn=k_xor,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
        torch=lambda t, node, a, b: a ^ b,
    ),
    OpDef(
        "BitwiseAnd",
        (18,),
        infer=_binary(_BITS),
        fn=k_bitwise_and,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
    ),
    OpDef(
        "BitwiseOr",
        (18,),
        infer=_binary(_BITS),
        fn=k_bitwise_or,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
    ),
    OpDef(
        "BitwiseXor",
        (18,),
        infer=_binary(_BITS),
        fn=k_bitwise_xor,
        flops=per_element(1),
        batch="broadcast",
        scratch=broadcast_scratch,
    ),
    OpDef(
        "BitwiseNot",
        (18,),
        infer=lambda node, inputs: infer_unary(node, inputs, _BITS),
        fn=k_bitwise_not,
        flops=per_element(1),
        scratch=no_scratch,
    ),
    OpDef(
        "BitShift",
        (11, 28),
        infer=_binary(((11, UNSIGNED), (28, INTS))),
        fn=k_bit_shift,
        flops=per_element(1),
        attrs=_shift_attrs,
        ATTRS={"direction": STR},
    ),
    OpDef(
        "PRelu",
        (6, 7, 9, 16),
        infer=_infer_prelu,
        fn=k_prelu,
        flops=per_element(2),
        attrs=lambda node: {"per_channel": node.version < 7},
        torch=_torch.prelu,
        scratch=broadcast_scratch,
    ),
)
