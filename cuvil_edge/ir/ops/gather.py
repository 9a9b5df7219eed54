"""Gather: take entries of ``data`` along ``axis`` at ``indices`` (negative indices count from the end);
the output shape is data.shape[:axis] + indices.shape + data.shape[axis+1:]."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import INT, axis_index, need, template_function

OP_TYPE = "Gather"
VERSIONS = (1, 11, 13)
ATTRS = {"axis": INT}


def infer(node, inputs):
    need(node, inputs, 2)
    data, indices = inputs
    if indices.dtype not in ("int32", "int64"):
        raise ShapeInferenceError(f"{node.describe()}: indices must be int32 or int64, got {indices.dtype}")
    if data.rank == 0:
        raise ShapeInferenceError(f"{node.describe()}: data must have rank >= 1")
    axis = axis_index(node, int(node.attr("axis", 0)), data.rank)
    return [TensorType(data.dtype, data.shape[:axis] + indices.shape + data.shape[axis + 1:])]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_gather(data, indices, axis):
    size = data.shape[axis]
    indices = np.asarray(indices).astype(np.int64)
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise IndexError(f"Gather index out of range for axis {axis} of size {size}")
    y = np.take(data, np.where(indices < 0, indices + size, indices), axis=axis)
    return y if isinstance(y, np.ndarray) else np.array(y, dtype=data.dtype)  # object data gives a bare element
'''

k_gather = template_function(TEMPLATE, "k_gather")


def kernel(node, data, indices):
    return [k_gather(data, indices, int(node.attr("axis", 0)))]


def emit(node, args, outs):
    return f"{outs[0]} = k_gather({args[0]}, {args[1]}, {int(node.attr('axis', 0))})"
