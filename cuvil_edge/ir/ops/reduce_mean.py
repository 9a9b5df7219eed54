"""ReduceMean: mean (integer inputs: the mean truncated to the input dtype) over ``axes``; axes is an input from opset 18 (see _reduce.py)."""

from __future__ import annotations

from cuvil_edge.ir.ops import _reduce
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "ReduceMean"
VERSIONS = (1, 11, 13, 18)
ATTRS = _reduce.ATTRS
CONST_INPUTS = (1,)
_SINCE = 18


def infer(node, inputs, consts=None):
    return _reduce.infer(node, inputs, consts, _SINCE)


flops = _reduce.flops

TEMPLATE = _reduce.TEMPLATE + '''

def k_reduce_mean(x, axes, keepdims, noop):
    axes = _reduce_axes(x, axes, noop)
    if axes is None:
        return x.copy()
    y = x.mean(axis=axes, keepdims=bool(keepdims), dtype=np.float64 if x.dtype.kind != "f" else None)
    return np.asarray(y).astype(x.dtype)
'''

k_reduce_mean = template_function(TEMPLATE, "k_reduce_mean")


def kernel(node, x, axes=None):
    return _reduce.kernel(k_reduce_mean, node, x, axes, _SINCE)


def emit(node, args, outs):
    return _reduce.emit("k_reduce_mean", node, args, outs, _SINCE)
