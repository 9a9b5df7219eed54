"""Slice: ``starts``/``ends``/``axes`` attributes before opset 10, inputs (plus ``steps``) from 10.
Starts and ends are clamped like Python slices; a symbolic axis passes through only when
sliced whole (start 0, end >= the dim, step 1) or ended at its own symbol."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import arg, axes as norm_axes, vector
from cuvil_edge.ir.ops._util import INTS, need, template_function

OP_TYPE = "Slice"
VERSIONS = (1, 10, 11, 13)
ATTRS = {"starts": INTS, "ends": INTS, "axes": INTS}
CONST_INPUTS = (1, 2, 3, 4)
_BIG = 2**62


def _params(node, consts, rank):
    if node.version < 10:
        starts, ends = list(node.attr("starts", ())), list(node.attr("ends", ()))
        axes, steps = node.attr("axes"), None
        axes = list(axes) if axes is not None else None
    else:
        starts = vector(node, consts, 1, "starts", symbols=True)
        ends = vector(node, consts, 2, "ends", symbols=True)
        axes = vector(node, consts, 3, "axes", required=False)
        steps = vector(node, consts, 4, "steps", required=False)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeInferenceError(f"{node.describe()}: starts, ends, axes and steps differ in length")
    if 0 in steps:
        raise ShapeInferenceError(f"{node.describe()}: a step is 0")
    return starts, ends, norm_axes(node, axes, rank), steps


def length(dim: int, start: int, end: int, step: int) -> int:
    """Elements x[start:end:step] has along an axis of size ``dim`` (ONNX clamping)."""
    return len(range(*slice(start, end, step).indices(dim)))


def infer(node, inputs, consts=None):
    need(node, inputs, 1, optional=4 if node.version >= 10 else 0)
    x = inputs[0]
    out = list(x.shape)
    for start, end, axis, step in zip(*_params(node, consts, x.rank)):
        dim = x.shape[axis]
        if isinstance(dim, str) or isinstance(start, str) or isinstance(end, str):
            if start == 0 and step == 1 and (end == dim or (isinstance(end, int) and end >= _BIG // 4)):
                continue
            raise ShapeInferenceError(
                f"{node.describe()}: slicing axis {axis} ({dim!r}) from {start!r} to {end!r} step {step} "
                "gives a size that depends on a symbol; make that dim static")
        out[axis] = length(dim, start, end, step)
    return [TensorType(x.dtype, tuple(out))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_slice(x, starts, ends, axes, steps):
    index = [slice(None)] * x.ndim
    if axes is None or len(axes) == 0:
        axes = range(len(starts))
    if steps is None or len(steps) == 0:
        steps = [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = int(axis) + x.ndim if int(axis) < 0 else int(axis)
        start, end, step = int(start), int(end), int(step)
        start, end, step = slice(start, end, step).indices(x.shape[axis])
        index[axis] = slice(start, end if end >= 0 else None, step)
    return x[tuple(index)].copy()
'''

k_slice = template_function(TEMPLATE, "k_slice")


def _static(node):
    axes = node.attr("axes")
    return (tuple(node.attr("starts", ())), tuple(node.attr("ends", ())),
            None if axes is None else tuple(axes), None)


def kernel(node, x, starts=None, ends=None, axes=None, steps=None):
    if node.version < 10:
        return [k_slice(x, *_static(node))]
    return [k_slice(x, starts, ends, axes, steps)]


def emit(node, args, outs):
    if node.version < 10:
        params = ", ".join(repr(p) for p in _static(node))
    else:
        params = ", ".join(arg(args, i) for i in range(1, 5))
    return f"{outs[0]} = k_slice({args[0]}, {params})"
