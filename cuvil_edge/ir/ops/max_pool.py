"""MaxPool: N-D max over windows; pads never win (filled with -inf / the dtype minimum).

The optional second output Indices (opset 8+) holds, per output element, the flat index of the
chosen input element in the whole unpadded X (batch and channel included): row-major over the
spatial dims, or column-major over them with storage_order=1; ties go to the first element in
row-major window order, as in ONNX's reference and onnxruntime.
"""

from __future__ import annotations

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import INT, WINDOW_ATTRS, WINDOW_TEMPLATE, ints, need, template_function, want_dtype, window_args
from cuvil_edge.ir.ops.average_pool import pool_type

OP_TYPE = "MaxPool"
VERSIONS = (1, 8, 10, 11, 12)
ATTRS = {**WINDOW_ATTRS, "ceil_mode": INT, "storage_order": INT}


def infer(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int8", "uint8"})
    y = pool_type(node, inputs[0])
    if not _wants_indices(node):
        return [y]
    if node.version < 8:
        raise UnsupportedAttributeError(f"{node.describe()} asks for the Indices output, which MaxPool has from opset 8")
    if int(node.attr("storage_order", 0)) not in (0, 1):
        raise UnsupportedAttributeError(f"{node.describe()}: storage_order={node.attr('storage_order')} (supported: 0, 1)")
    return [y, TensorType("int64", y.shape)]


def _wants_indices(node):
    return len(node.outputs) > 1 and bool(node.outputs[1])


def _args(node):
    return (tuple(ints(node, "kernel_shape")), *(tuple(ints(node, key)) for key in ("strides", "pads", "dilations")),
            node.attr("auto_pad", "NOTSET"), int(node.attr("ceil_mode", 0)))


def kernel(node, x):
    if _wants_indices(node):
        return list(k_max_pool_indices(x, *_args(node), int(node.attr("storage_order", 0))))
    return [k_max_pool(x, *_args(node))]


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


def k_max_pool_indices(x, kernel, strides, pads, dilations, auto_pad, ceil_mode, storage_order):
    """(Y, Indices): the flat index into X of each window's first maximum, pads excluded."""
    spatial = x.shape[2:]
    n = len(kernel)
    strides, pads, dilations, out = _win_geometry(spatial, kernel, strides, pads, dilations, auto_pad, ceil_mode)
    if storage_order:
        steps = [int(np.prod(spatial[:i], dtype=np.int64)) for i in range(n)]
    else:
        steps = [int(np.prod(spatial[i + 1:], dtype=np.int64)) for i in range(n)]
    base = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * int(np.prod(spatial, dtype=np.int64)))
    base = base.reshape(x.shape[:2] + (1,) * n)
    y = np.zeros(x.shape[:2] + tuple(out), dtype=x.dtype)
    index = np.full(y.shape, -1, dtype=np.int64)
    for tap in np.ndindex(*kernel):
        valid = np.ones(tuple(out), dtype=bool)
        flat = np.zeros(tuple(out), dtype=np.int64)
        where = []
        for i in range(n):
            pos = np.arange(out[i], dtype=np.int64) * strides[i] - pads[i] + tap[i] * dilations[i]
            shape = [1] * n
            shape[i] = out[i]
            ok = (pos >= 0) & (pos < spatial[i])
            valid = valid & ok.reshape(shape)
            flat = flat + (np.clip(pos, 0, spatial[i] - 1) * steps[i]).reshape(shape)
            where.append(np.clip(pos, 0, spatial[i] - 1).reshape(shape))
        v = x[(slice(None), slice(None)) + tuple(np.broadcast_arrays(*where))] if n else x
        take = valid & ((index < 0) | (v > y))
        y = np.where(take, v, y)
        index = np.where(take, base + flat, index)
    return y, index
'''

k_max_pool = template_function(TEMPLATE, "k_max_pool")
k_max_pool_indices = template_function(TEMPLATE, "k_max_pool_indices")


def emit(node, args, outs):
    kernel_shape = tuple(ints(node, "kernel_shape"))
    call = f"({args[0]}, {kernel_shape!r}, {window_args(node)}, {int(node.attr('ceil_mode', 0))}"
    if len(outs) > 1 and outs[1] != "_" and _wants_indices(node):
        return f"{outs[0]}, {outs[1]} = k_max_pool_indices{call}, {int(node.attr('storage_order', 0))})"
    return f"{outs[0]} = k_max_pool{call})"
