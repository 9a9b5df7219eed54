"""QLinearMatMul: quantized MatMul, y = saturate(rint((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp)."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import mat_mul, mat_mul_integer
from cuvil_edge.ir.ops._quant import quant_dtype, same_pair, scale_dtype
from cuvil_edge.ir.ops._util import need, template_function

OP_TYPE = "QLinearMatMul"
#: 21 adds float8 inputs and float16/bfloat16 scales (float8 is rejected).
VERSIONS = (10, 21)


def infer(node, inputs):
    need(node, inputs, 8)
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
    for t, what in ((a, "a"), (b, "b"), (y_zp, "y_zero_point")):
        quant_dtype(node, t, what)
    same_pair(node, a, a_zp, "a and a_zero_point")
    same_pair(node, b, b_zp, "b and b_zero_point")
    scale_dtype(node, [a_scale, b_scale, y_scale])
    if y_scale.numel() != 1:
        raise ShapeInferenceError(f"{node.describe()}: y_scale must be a scalar, got {y_scale}")
    batch, m, _, n = mat_mul._split(node, a, b)
    return [TensorType(y_zp.dtype, (*batch, *(d for d in (m, n) if d is not None)))]


def kernel(node, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    return [k_q_linear_mat_mul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)]


def flops(node, inputs, outputs):
    return mat_mul.flops(node, [inputs[0], inputs[3]], outputs) + 3 * outputs[0].numel()


TEMPLATE = mat_mul_integer.TEMPLATE + '''

def k_q_linear_mat_mul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    acc = np.matmul(_q_centered_a(a, a_zp), _q_centered_b(b, b_zp))
    a_scale = a_scale.astype(np.float32)
    if a_scale.ndim == 1 and a_scale.size > 1 and a.ndim >= 2:
        a_scale = a_scale.reshape(-1, 1)
    multiplier = a_scale * b_scale.astype(np.float32) / y_scale.astype(np.float32)
    return _q_requantize(acc, multiplier, y_zp, y_zp.dtype)
'''

k_q_linear_mat_mul = template_function(TEMPLATE, "k_q_linear_mat_mul")


def emit(node, args, outs):
    return f"{outs[0]} = k_q_linear_mat_mul({', '.join(args)})"
