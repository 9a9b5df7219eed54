"""MaxPool: N-D max over windows; pads never win (filled with -inf / the dtype minimum).

Only the first output (Y) is implemented; a requested Indices output is rejected.
"""

from __future__ import annotations

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.ops._util import WINDOW_TEMPLATE, ints, need, template_function, want_dtype, window_args
from cuvil_edge.ir.ops.average_pool import pool_type

OP_TYPE = "MaxPool"
VERSIONS = (1, 8, 10, 11, 12)


def infer(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int8", "uint8"})
    if len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedAttributeError(f"{node.describe()} asks for the Indices output, which is not supported; drop it")
    return [pool_type(node, inputs[0])]


def kernel(node, x):
    return [k_max_pool(x, tuple(ints(node, "kernel_shape")),
                       *(tuple(ints(node, key)) for key in ("strides", "pads", "dilations")),
                       node.attr("auto_pad", "NOTSET"), int(node.attr("ceil_mode", 0)))]


def flops(node, inputs, outputs):
    taps = 1
    for k in ints(node, "kernel_shape"):
        taps *= k
    return outputs[0].numel() * taps


TEMPLATE = WINDOW_TEMPLATE + '''

def k_max_pool(x, kernel, strides, pads, dilations, auto_pad, ceil_mode):
    strides, pads, dilations, out = _win_geometry(x.shape[2:], kernel, strides, pads, dilations, auto_pad, ceil_mode)
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    y = None
    for _, v in _win_taps(x, kernel, strides, pads, dilations, out, fill):
        y = v.copy() if y is None else np.maximum(y, v, out=y)
    return y
'''

k_max_pool = template_function(TEMPLATE, "k_max_pool")


def emit(node, args, outs):
    kernel_shape = tuple(ints(node, "kernel_shape"))
    return (f"{outs[0]} = k_max_pool({args[0]}, {kernel_shape!r}, {window_args(node)}, "
            f"{int(node.attr('ceil_mode', 0))})")
