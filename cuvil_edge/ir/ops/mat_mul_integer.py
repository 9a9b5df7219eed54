"""MatMulInteger: int32 Y = (A - a_zero_point) @ (B - b_zero_point) for int8/uint8 A and B."""

from __future__ import annotations

from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import mat_mul
from cuvil_edge.ir.ops._quant import HELPERS_TEMPLATE, quant_dtype, same_pair
from cuvil_edge.ir.ops._util import need, template_function

OP_TYPE = "MatMulInteger"
VERSIONS = (10,)


def infer(node, inputs):
    need(node, inputs, 2, optional=2)
    a, b = inputs[0], inputs[1]
    quant_dtype(node, a, "A")
    quant_dtype(node, b, "B")
    same_pair(node, a, inputs[2] if len(inputs) > 2 else None, "A and a_zero_point")
    same_pair(node, b, inputs[3] if len(inputs) > 3 else None, "B and b_zero_point")
    batch, m, _, n = mat_mul._split(node, a, b)
    return [TensorType("int32", (*batch, *(d for d in (m, n) if d is not None)))]


def kernel(node, a, b, a_zero_point=None, b_zero_point=None):
    return [k_mat_mul_integer(a, b, a_zero_point, b_zero_point)]


def flops(node, inputs, outputs):
    return mat_mul.flops(node, inputs[:2], outputs)


TEMPLATE = HELPERS_TEMPLATE + '''

def _q_centered_a(a, zero_point):
    """A as int32 minus its zero point (a 1-D zero point is per row)."""
    a = a.astype(np.int32)
    if zero_point is None:
        return a
    if zero_point.ndim == 1 and zero_point.size > 1 and a.ndim >= 2:
        zero_point = zero_point.reshape(-1, 1)
    return a - zero_point.astype(np.int32)


def _q_centered_b(b, zero_point):
    """B as int32 minus its zero point (a 1-D zero point is per column)."""
    b = b.astype(np.int32)
    return b if zero_point is None else b - zero_point.astype(np.int32)


def k_mat_mul_integer(a, b, a_zero_point, b_zero_point):
    return np.asarray(np.matmul(_q_centered_a(a, a_zero_point), _q_centered_b(b, b_zero_point)), dtype=np.int32)
'''

k_mat_mul_integer = template_function(TEMPLATE, "k_mat_mul_integer")


def emit(node, args, outs):
    zps = [args[i] if len(args) > i and args[i] else "None" for i in (2, 3)]
    return f"{outs[0]} = k_mat_mul_integer({args[0]}, {args[1]}, {zps[0]}, {zps[1]})"
