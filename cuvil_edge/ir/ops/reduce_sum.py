"""ReduceSum: sum over ``axes``; axes is an input from opset 13 (see _reduce.py)."""

from __future__ import annotations

from cuvil_edge.ir.ops import _reduce
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "ReduceSum"
VERSIONS = (1, 11, 13)
ATTRS = _reduce.ATTRS
CONST_INPUTS = (1,)
_SINCE = 13


def infer(node, inputs, consts=None):
    return _reduce.infer(node, inputs, consts, _SINCE)


flops = _reduce.flops

TEMPLATE = _reduce.TEMPLATE + '''

def k_reduce_sum(x, axes, keepdims, noop):
    axes = _reduce_axes(x, axes, noop)
    if axes is None:
        return x.copy()
    return np.asarray(x.sum(axis=axes, keepdims=bool(keepdims), dtype=x.dtype))
'''

k_reduce_sum = template_function(TEMPLATE, "k_reduce_sum")


def kernel(node, x, axes=None):
    return _reduce.kernel(k_reduce_sum, node, x, axes, _SINCE)


def emit(node, args, outs):
    return _reduce.emit("k_reduce_sum", node, args, outs, _SINCE)
