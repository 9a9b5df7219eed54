"""Squeeze: drop size-1 axes (``axes`` attribute before opset 13, optional input from 13;
without axes every size-1 axis, which a symbolic dim makes ambiguous)."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import arg, attr_or_input, axes as norm_axes
from cuvil_edge.ir.ops._util import INTS, need, template_function

OP_TYPE = "Squeeze"
VERSIONS = (1, 11, 13, 21, 23, 24, 25)
ATTRS = {"axes": INTS}
CONST_INPUTS = (1,)


def infer(node, inputs, consts=None):
    need(node, inputs, 1, optional=1 if node.version >= 13 else 0)
    x = inputs[0]
    axes = attr_or_input(node, consts, "axes", 1, 13)
    if not axes:
        if x.symbols():
            raise ShapeInferenceError(
                f"{node.describe()}: without axes it squeezes every size-1 axis, but {x} has symbolic dims "
                "that may or may not be 1; give axes explicitly")
        return [TensorType(x.dtype, tuple(d for d in x.shape if d != 1))]
    axes = norm_axes(node, axes, x.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeInferenceError(
                f"{node.describe()}: axis {a} of {x} is {x.shape[a]!r}, not 1, so it cannot be squeezed"
                + ("; fix that dim to 1" if isinstance(x.shape[a], str) else ""))
    return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_squeeze(x, axes):
    if axes is None or len(axes) == 0:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(int(a) for a in axes))
'''

k_squeeze = template_function(TEMPLATE, "k_squeeze")


def _static(node):
    axes = node.attr("axes") if node.version < 13 else None
    return None if axes is None else tuple(int(a) for a in axes)


def kernel(node, x, axes=None):
    return [k_squeeze(x, _static(node) if node.version < 13 else axes)]


def emit(node, args, outs):
    axes = repr(_static(node)) if node.version < 13 else arg(args, 1)
    return f"{outs[0]} = k_squeeze({args[0]}, {axes})"
