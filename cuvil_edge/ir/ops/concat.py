"""Concat: join inputs along ``axis`` (negative from opset 11).  Other axes must agree
(a symbol meets an int by taking the int); a symbol on the joined axis cannot be summed."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import same_rank
from cuvil_edge.ir.ops._util import INT, axis_index, same_dtype, template_function

OP_TYPE = "Concat"
VERSIONS = (4, 11, 13)
ATTRS = {"axis": INT}


def _axis(node):
    axis = node.attr("axis")
    if axis is None:
        raise ShapeInferenceError(f"{node.describe()} needs the 'axis' attribute")
    return int(axis)


def infer(node, inputs):
    if not inputs or any(t is None for t in inputs):
        raise ShapeInferenceError(f"{node.describe()} needs at least one input and no empty ones")
    dtype = same_dtype(node, inputs)
    rank = same_rank(node, inputs)
    axis = axis_index(node, _axis(node), rank)
    out, total = list(inputs[0].shape), 0
    for t in inputs:
        for i, d in enumerate(t.shape):
            if i == axis:
                if isinstance(d, str):
                    if len(inputs) == 1:
                        total = d
                        continue
                    raise ShapeInferenceError(
                        f"{node.describe()}: cannot concatenate along axis {axis}, which is symbolic ({d!r}) in {t}")
                total += d
            elif d != out[i]:
                if isinstance(out[i], str):
                    out[i] = d
                elif not isinstance(d, str):
                    raise ShapeInferenceError(
                        f"{node.describe()}: inputs differ on axis {i} ({out[i]} vs {d}); only axis {axis} may differ")
    out[axis] = total
    return [TensorType(dtype, tuple(out))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_concat(xs, axis):
    return np.concatenate(xs, axis=axis)
'''

k_concat = template_function(TEMPLATE, "k_concat")


def kernel(node, *xs):
    return [k_concat(xs, _axis(node))]


def emit(node, args, outs):
    return f"{outs[0]} = k_concat(({', '.join(args)},), {_axis(node)})"
