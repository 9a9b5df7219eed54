"""AveragePool: N-D mean over windows; count_include_pad decides whether explicit pads count.

Windows that ceil_mode extends past the padded input never count those extra cells
(as onnxruntime and PyTorch do).
"""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import INT, WINDOW_ATTRS, WINDOW_TEMPLATE, ints, need, pool_out, spatial_attrs, template_function, want_dtype, window_args

OP_TYPE = "AveragePool"
VERSIONS = (1, 7, 10, 11, 19)
ATTRS = {**WINDOW_ATTRS, "ceil_mode": INT, "count_include_pad": INT}


def pool_type(node, x: TensorType) -> TensorType:
    """Output type of a MaxPool/AveragePool node on input ``x`` (shared with max_pool)."""
    kernel = ints(node, "kernel_shape")
    if not kernel or x.rank != len(kernel) + 2:
        raise ShapeInferenceError(f"{node.describe()} needs kernel_shape with one entry per spatial dim of {x}")
    strides, pads, dilations = spatial_attrs(node, x.shape[2:], kernel)
    n, ceil_mode = len(kernel), int(node.attr("ceil_mode", 0))
    out = [pool_out(node, x.shape[2 + i], kernel[i], strides[i], pads[i], pads[i + n], dilations[i], ceil_mode)
           for i in range(n)]
    return TensorType(x.dtype, (*x.shape[:2], *out))


def infer(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    return [pool_type(node, inputs[0])]


def kernel(node, x):
    return [k_average_pool(x, tuple(ints(node, "kernel_shape")),
                           *(tuple(ints(node, key)) for key in ("strides", "pads", "dilations")),
                           node.attr("auto_pad", "NOTSET"), int(node.attr("ceil_mode", 0)),
                           int(node.attr("count_include_pad", 0)))]


def flops(node, inputs, outputs):
    taps = 1
    for k in ints(node, "kernel_shape"):
        taps *= k
    return outputs[0].numel() * (taps + 1)


TEMPLATE = WINDOW_TEMPLATE + '''

def k_average_pool(x, kernel, strides, pads, dilations, auto_pad, ceil_mode, count_include_pad):
    strides, pads, dilations, out = _win_geometry(x.shape[2:], kernel, strides, pads, dilations, auto_pad, ceil_mode)
    n = len(kernel)
    total = np.zeros(x.shape[:2] + out, dtype=x.dtype)
    for _, v in _win_taps(x, kernel, strides, pads, dilations, out, 0):
        total += v
    inside = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if count_include_pad:
        inside = np.pad(inside, [(0, 0), (0, 0)] + [(pads[i], pads[i + n]) for i in range(n)], constant_values=1)
        pads = (0,) * (2 * n)
    count = np.zeros((1, 1) + out, dtype=x.dtype)
    for _, v in _win_taps(inside, kernel, strides, pads, dilations, out, 0):
        count += v
    return total / count
'''

k_average_pool = template_function(TEMPLATE, "k_average_pool")


def emit(node, args, outs):
    kernel_shape = tuple(ints(node, "kernel_shape"))
    return (f"{outs[0]} = k_average_pool({args[0]}, {kernel_shape!r}, {window_args(node)}, "
            f"{int(node.attr('ceil_mode', 0))}, {int(node.attr('count_include_pad', 0))})")
