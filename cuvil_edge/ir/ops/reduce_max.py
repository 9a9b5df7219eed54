"""ReduceMax: max (bool inputs from opset 20) over ``axes``; axes is an input from opset 18 (see _reduce.py).

Reducing an empty set gives max's identity, as ONNX defines it: -inf for floats, the dtype's
minimum for integers, False for bool."""

from __future__ import annotations

from cuvil_edge.ir.ops import _reduce
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "ReduceMax"
VERSIONS = (1, 11, 12, 13, 18, 20)
ATTRS = _reduce.ATTRS
CONST_INPUTS = (1,)
_SINCE = 18


def infer(node, inputs, consts=None):
    return _reduce.infer(node, inputs, consts, _SINCE, allowed=_reduce.NUMBERS | {"bool"})


flops = _reduce.flops

TEMPLATE = _reduce.TEMPLATE + '''

def k_reduce_max(x, axes, keepdims, noop):
    axes = _reduce_axes(x, axes, noop)
    if axes is None:
        return x.copy()
    if x.size == 0:
        low = -np.inf if x.dtype.kind == "f" else False if x.dtype.kind == "b" else np.iinfo(x.dtype).min
        return np.asarray(np.max(x, axis=axes, keepdims=bool(keepdims), initial=low)).astype(x.dtype)
    return np.asarray(x.max(axis=axes, keepdims=bool(keepdims)))
'''

k_reduce_max = template_function(TEMPLATE, "k_reduce_max")


def kernel(node, x, axes=None):
    return _reduce.kernel(k_reduce_max, node, x, axes, _SINCE)


def emit(node, args, outs):
    return _reduce.emit("k_reduce_max", node, args, outs, _SINCE)
