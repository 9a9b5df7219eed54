"""Shape: the input's dims as int64[n]; from opset 15 only dims start..end (clamped, negative from the end)."""

from __future__ import annotations

from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import INT, need, template_function

OP_TYPE = "Shape"
VERSIONS = (1, 13, 15, 19, 21, 23, 24, 25)
ATTRS = {"start": INT, "end": INT}


def bounds(node, rank: int) -> tuple[int, int]:
    """The clamped [start, end) of the dims this node returns."""
    if node.version < 15:
        return 0, rank
    start, end = int(node.attr("start", 0)), node.attr("end")
    end = rank if end is None else int(end)
    start, end = (v + rank if v < 0 else v for v in (start, end))
    return min(max(start, 0), rank), min(max(end, 0), rank)


def infer(node, inputs):
    need(node, inputs, 1)
    start, end = bounds(node, inputs[0].rank)
    return [TensorType("int64", (max(end - start, 0),))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_shape(x, start, end):
    return np.array(x.shape[start:end], dtype=np.int64)
'''

k_shape = template_function(TEMPLATE, "k_shape")


def kernel(node, x):
    return [k_shape(x, *bounds(node, x.ndim))]


def emit(node, args, outs):
    start, end = node.attr("start", 0) if node.version >= 15 else 0, node.attr("end") if node.version >= 15 else None
    return f"{outs[0]} = k_shape({args[0]}, {int(start)}, {None if end is None else int(end)})"
