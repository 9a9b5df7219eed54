"""ConvInteger: int32 Conv of (x - x_zero_point) with (w - w_zero_point), int8/uint8 inputs, no bias."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import conv
from cuvil_edge.ir.ops._quant import HELPERS_TEMPLATE, quant_dtype, same_pair
from cuvil_edge.ir.ops._util import INT, WINDOW_ATTRS, need, template_function, window_args

OP_TYPE = "ConvInteger"
VERSIONS = (10,)
ATTRS = {**WINDOW_ATTRS, "group": INT}


def check_zero_points(node, x_zp, w_zp, m):
    """x's zero point is per tensor; w's per tensor or per output channel."""
    if x_zp is not None and x_zp.numel() != 1:
        raise ShapeInferenceError(f"{node.describe()}: x_zero_point must be a scalar, got {x_zp}")
    if w_zp is not None and w_zp.numel() not in (1, m):
        raise ShapeInferenceError(f"{node.describe()}: w_zero_point {w_zp} must be a scalar or have {m} elements")


def infer(node, inputs):
    need(node, inputs, 2, optional=2)
    x, w = inputs[0], inputs[1]
    x_zp, w_zp = (inputs[i] if len(inputs) > i else None for i in (2, 3))
    quant_dtype(node, x, "x")
    quant_dtype(node, w, "w")
    same_pair(node, x, x_zp, "x and x_zero_point")
    same_pair(node, w, w_zp, "w and w_zero_point")
    *_, out = conv._geometry(node, x.shape, w.shape)
    check_zero_points(node, x_zp, w_zp, w.shape[0])
    return [TensorType("int32", (x.shape[0], w.shape[0], *out))]


def kernel(node, x, w, x_zp=None, w_zp=None):
    xi, wi = k_q_centered_conv_inputs(x, w, x_zp, w_zp)
    return conv.kernel(node, xi, wi)


def flops(node, inputs, outputs):
    return conv.flops(node, inputs[:2], outputs)


TEMPLATE = conv.TEMPLATE + HELPERS_TEMPLATE + '''

def k_q_centered_conv_inputs(x, w, x_zp, w_zp):
    """x and w as int32 minus their zero points (w's may be per output channel)."""
    x = x.astype(np.int32)
    w = w.astype(np.int32)
    if x_zp is not None:
        x = x - x_zp.astype(np.int32).reshape(())
    if w_zp is not None:
        w = w - _q_along(w_zp.astype(np.int32), w.ndim, 0)
    return x, w


def k_conv_integer(x, w, x_zp, w_zp, strides, pads, dilations, auto_pad, group):
    x, w = k_q_centered_conv_inputs(x, w, x_zp, w_zp)
    return k_conv(x, w, None, strides, pads, dilations, auto_pad, group)
'''

k_q_centered_conv_inputs = template_function(TEMPLATE, "k_q_centered_conv_inputs")


def emit(node, args, outs):
    zps = [args[i] if len(args) > i and args[i] else "None" for i in (2, 3)]
    return (f"{outs[0]} = k_conv_integer({args[0]}, {args[1]}, {zps[0]}, {zps[1]}, {window_args(node)}, "
            f"{int(node.attr('group', 1))})")
