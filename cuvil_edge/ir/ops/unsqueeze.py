"""Unsqueeze: insert size-1 axes at ``axes`` of the output (attribute before opset 13, input from 13;
negative axes count from the output's end, opset >= 11)."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import attr_or_input, axes as norm_axes
from cuvil_edge.ir.ops._util import INTS, need, template_function

OP_TYPE = "Unsqueeze"
VERSIONS = (1, 11, 13, 21, 23, 24, 25)
ATTRS = {"axes": INTS}
CONST_INPUTS = (1,)


def infer(node, inputs, consts=None):
    need(node, inputs, 2 if node.version >= 13 else 1)
    x = inputs[0]
    axes = attr_or_input(node, consts, "axes", 1, 13, required=True)
    if not axes:
        raise ShapeInferenceError(f"{node.describe()} needs a non-empty 'axes'")
    rank = x.rank + len(axes)
    axes = set(norm_axes(node, axes, rank))
    dims = iter(x.shape)
    return [TensorType(x.dtype, tuple(1 if i in axes else next(dims) for i in range(rank)))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_unsqueeze(x, axes):
    rank = x.ndim + len(axes)
    axes = sorted(int(a) + rank if int(a) < 0 else int(a) for a in axes)
    return x.reshape(x.shape) if not axes else np.expand_dims(x, tuple(axes))
'''

k_unsqueeze = template_function(TEMPLATE, "k_unsqueeze")


def _static(node):
    return tuple(int(a) for a in node.attr("axes", ()))


def kernel(node, x, axes=None):
    return [k_unsqueeze(x, _static(node) if node.version < 13 else axes)]


def emit(node, args, outs):
    axes = repr(_static(node)) if node.version < 13 else args[1]
    return f"{outs[0]} = k_unsqueeze({args[0]}, {axes})"
