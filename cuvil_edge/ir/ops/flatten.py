"""Flatten: reshape to 2-D (prod(shape[:axis]), prod(shape[axis:])); axis may be negative (opset >= 11)."""

from __future__ import annotations

from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import INT, axis_index, dim_product, need, template_function

OP_TYPE = "Flatten"
VERSIONS = (1, 9, 11, 13, 21)
ATTRS = {"axis": INT}


def infer(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    axis = axis_index(node, node.attr("axis", 1), x.rank, extra=1)
    return [TensorType(x.dtype, (dim_product(node, x.shape[:axis]), dim_product(node, x.shape[axis:])))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_flatten(x, axis):
    if axis < 0:
        axis += x.ndim
    left = int(np.prod(x.shape[:axis], dtype=np.int64))
    right = int(np.prod(x.shape[axis:], dtype=np.int64))
    return x.reshape(left, right)
'''

k_flatten = template_function(TEMPLATE, "k_flatten")


def kernel(node, x):
    return [k_flatten(x, int(node.attr("axis", 1)))]


def emit(node, args, outs):
    return f"{outs[0]} = k_flatten({args[0]}, {int(node.attr('axis', 1))})"
