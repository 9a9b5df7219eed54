"""CuvilQLinearAdd (internal, made by ``passes/fuse_qdq.py``): QuantizeLinear(DequantizeLinear(a) +
DequantizeLinear(b)) of int8/uint8 a and b with per-tensor scales and zero points, in one kernel.

    y = saturate(rint(((a - a_zp) · a_scale + (b - b_zp) · b_scale) / y_scale) + y_zp)

computed with the float32 operations of the three ops it replaces, in their order, so it returns
exactly what they do; natively in one pass (``cuvil_i8_add``) where the target has the int8 kernels
and a and b have one shape, else in numpy with broadcasting. The residual additions of an int8
network stay int8 between its QLinearConvs instead of costing a float tensor each.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._int8 import _i8_ops
from cuvil_edge.ir.ops._quant import _q_saturate, quant_dtype, same_pair, scale_dtype
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES, broadcast, need

TARGET_INT8_DOT = DEFAULT_CAPABILITIES["TARGET_INT8_DOT"]


def k_q_linear_add(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    if TARGET_INT8_DOT != "none":
        # the three ops in one native pass, the same float32 arithmetic
        i8 = _i8_ops() if a.shape == b.shape else None
        y = None if i8 is None else i8.add(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
        if y is not None:
            return y
    da = (a.astype(np.float32) - a_zp.astype(np.float32)) * a_scale.astype(np.float32)
    db = (b.astype(np.float32) - b_zp.astype(np.float32)) * b_scale.astype(np.float32)
    q = np.rint((da + db) / y_scale.astype(np.float32)).astype(np.float32)
    return _q_saturate(q + y_zp.astype(np.float32), y_zp.dtype)


def _infer(node, inputs):
    need(node, inputs, 8)
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
    for t, what in ((a, "a"), (b, "b"), (y_zp, "y_zero_point")):
        quant_dtype(node, t, what)
    same_pair(node, a, a_zp, "a and a_zero_point")
    same_pair(node, b, b_zp, "b and b_zero_point")
    scale_dtype(node, [a_scale, b_scale, y_scale])
    if any(t.numel() != 1 for t in (a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)):
        raise ShapeInferenceError(f"{node.describe()}: scales and zero points must be scalars (per tensor)")
    return [TensorType(y_zp.dtype, broadcast(node, a.shape, b.shape))]


OPS = (
    OpDef(
        "CuvilQLinearAdd", (1,), infer=_infer, fn=k_q_linear_add, flops=per_element(8), helpers=(_i8_ops, _q_saturate)
    ),
)
