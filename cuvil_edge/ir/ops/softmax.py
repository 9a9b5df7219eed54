"""Softmax: opset < 13 normalises the 2-D flattening at ``axis`` (default 1);
opset >= 13 normalises along ``axis`` alone (default -1)."""

from __future__ import annotations

from cuvil_edge.ir import dtypes
from cuvil_edge.ir.ops._util import INT, axis_index, need, template_function, want_dtype

OP_TYPE = "Softmax"
VERSIONS = (1, 11, 13)
ATTRS = {"axis": INT}


def _axis(node):
    return int(node.attr("axis", -1 if node.version >= 13 else 1))


def infer(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    axis_index(node, _axis(node), inputs[0].rank)
    return [inputs[0]]


def flops(node, inputs, outputs):
    return 4 * outputs[0].numel()  # subtract max, exp, sum, divide


TEMPLATE = '''
def k_softmax(x, axis, legacy):
    if axis < 0:
        axis += x.ndim
    if legacy:
        rows = 1
        for d in x.shape[:axis]:
            rows *= d
        return k_softmax(x.reshape(rows, -1) if x.size else x, 1, 0).reshape(x.shape)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
'''

k_softmax = template_function(TEMPLATE, "k_softmax")


def kernel(node, x):
    return [k_softmax(x, _axis(node), int(node.version < 13))]


def emit(node, args, outs):
    return f"{outs[0]} = k_softmax({args[0]}, {_axis(node)}, {int(node.version < 13)})"
