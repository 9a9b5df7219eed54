"""QLinearConv: quantized Conv, int32 accumulation (+ int32 bias) requantized to y's scale and zero point."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import conv, conv_integer
from cuvil_edge.ir.ops._quant import quant_dtype, same_pair, scale_dtype
from cuvil_edge.ir.ops._util import INT, WINDOW_ATTRS, need, template_function, window_args

OP_TYPE = "QLinearConv"
VERSIONS = (10,)
ATTRS = {**WINDOW_ATTRS, "group": INT}


def infer(node, inputs):
    need(node, inputs, 8, optional=1)
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    for t, what in ((x, "x"), (w, "w"), (y_zp, "y_zero_point")):
        quant_dtype(node, t, what)
    same_pair(node, x, x_zp, "x and x_zero_point")
    same_pair(node, w, w_zp, "w and w_zero_point")
    scale_dtype(node, [x_scale, w_scale, y_scale])
    *_, out = conv._geometry(node, x.shape, w.shape)
    m = w.shape[0]
    conv_integer.check_zero_points(node, x_zp, w_zp, m)
    if x_scale.numel() != 1 or y_scale.numel() != 1 or y_zp.numel() != 1 or w_scale.numel() not in (1, m):
        raise ShapeInferenceError(f"{node.describe()}: x/y scales and y_zero_point must be scalars and w_scale "
                                  f"a scalar or have {m} elements")
    if bias is not None and (bias.dtype != "int32" or bias.shape != (m,)):
        raise ShapeInferenceError(f"{node.describe()}: B must be int32 of shape ({m},), got {bias}")
    return [TensorType(y_zp.dtype, (x.shape[0], m, *out))]


def kernel(node, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
    xi, wi = conv_integer.k_q_centered_conv_inputs(x, w, x_zp, w_zp)
    (acc,) = conv.kernel(node, xi, wi, bias)
    return [k_q_conv_requantize(acc, x_scale, w_scale, y_scale, y_zp)]


def flops(node, inputs, outputs):
    return conv.flops(node, [inputs[0], inputs[3], *inputs[8:]], outputs) + 3 * outputs[0].numel()


TEMPLATE = conv_integer.TEMPLATE + '''

def k_q_conv_requantize(acc, x_scale, w_scale, y_scale, y_zp):
    """Per-output-channel multiplier x_scale * w_scale / y_scale (float32), then rint + zero point, saturated."""
    w_scale = _q_along(w_scale.astype(np.float32), acc.ndim, 1)
    multiplier = x_scale.astype(np.float32).reshape(()) * w_scale / y_scale.astype(np.float32).reshape(())
    return _q_requantize(acc, multiplier, y_zp.reshape(()), y_zp.dtype)


def k_q_linear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias, strides, pads, dilations, auto_pad, group):
    xi, wi = k_q_centered_conv_inputs(x, w, x_zp, w_zp)
    acc = k_conv(xi, wi, bias, strides, pads, dilations, auto_pad, group)
    return k_q_conv_requantize(acc, x_scale, w_scale, y_scale, y_zp)
'''

k_q_conv_requantize = template_function(TEMPLATE, "k_q_conv_requantize")


def emit(node, args, outs):
    bias = args[8] if len(args) > 8 and args[8] else "None"
    return (f"{outs[0]} = k_q_linear_conv({', '.join(args[:8])}, {bias}, {window_args(node)}, "
            f"{int(node.attr('group', 1))})")
