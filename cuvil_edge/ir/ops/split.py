"""Split: cut the input along ``axis`` into len(outputs) parts: sizes from the ``split``
attribute (before opset 13) or input (from 13), else equal parts; from opset 18 ``num_outputs``
parts of ceil(dim / num_outputs), the last one smaller."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import arg, attr_or_input
from cuvil_edge.ir.ops._util import INT, INTS, axis_index, need, template_function

OP_TYPE = "Split"
VERSIONS = (2, 11, 13, 18)
ATTRS = {"axis": INT, "num_outputs": INT, "split": INTS}
CONST_INPUTS = (1,)


def sizes(node, dim: int, split, count: int) -> list[int]:
    """Part lengths along the split axis.

    Raises:
        ShapeInferenceError: no outputs, or the split / num_outputs does not cut ``dim`` into ``count`` parts.
    """
    if count < 1:
        raise ShapeInferenceError(f"{node.describe()} has no outputs; Split needs at least one")
    if split:
        if len(split) != count or sum(split) != dim or min(split) < 0:
            raise ShapeInferenceError(f"{node.describe()}: split {list(split)} does not cut {dim} into {count} parts")
        return [int(s) for s in split]
    parts = node.attr("num_outputs") if node.version >= 18 else None
    if parts is not None:
        if int(parts) != count or count < 1:
            raise ShapeInferenceError(f"{node.describe()}: num_outputs={parts} but the node has {count} outputs")
        step = -(-dim // count)
        return [max(0, min(step, dim - i * step)) for i in range(count)]
    if dim % count:
        raise ShapeInferenceError(f"{node.describe()}: axis size {dim} does not divide into {count} equal parts")
    return [dim // count] * count


def infer(node, inputs, consts=None):
    need(node, inputs, 1, optional=1 if node.version >= 13 else 0)
    x = inputs[0]
    axis = axis_index(node, int(node.attr("axis", 0)), x.rank)
    split = attr_or_input(node, consts, "split", 1, 13)
    dim = x.shape[axis]
    if isinstance(dim, str):
        raise ShapeInferenceError(f"{node.describe()}: cannot split symbolic axis {axis} ({dim!r}) of {x}")
    parts = sizes(node, dim, split, len(node.outputs))
    return [TensorType(x.dtype, x.shape[:axis] + (p,) + x.shape[axis + 1:]) for p in parts]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_split(x, split, axis, count, num_outputs):
    if axis < 0:
        axis += x.ndim
    dim = x.shape[axis]
    if split is None or len(split) == 0:
        step = -(-dim // count) if num_outputs else dim // count
        split = [max(0, min(step, dim - i * step)) for i in range(count)]
    cuts = np.cumsum([int(s) for s in split])[:-1]
    return [part.copy() for part in np.split(x, cuts, axis=axis)]
'''

k_split = template_function(TEMPLATE, "k_split")


def _static(node):
    value = node.attr("split") if node.version < 13 else None
    return None if value is None else tuple(int(s) for s in value)


def _num_outputs(node):
    return int(node.version >= 18 and node.attr("num_outputs") is not None)


def kernel(node, x, split=None):
    split = _static(node) if node.version < 13 else split
    return k_split(x, split, int(node.attr("axis", 0)), len(node.outputs), _num_outputs(node))


def emit(node, args, outs):
    split = repr(_static(node)) if node.version < 13 else arg(args, 1)
    return (f"{', '.join(outs)}, = k_split({args[0]}, {split}, {int(node.attr('axis', 0))}, "
            f"{len(node.outputs)}, {_num_outputs(node)})")
