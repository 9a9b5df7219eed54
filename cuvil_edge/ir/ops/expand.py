"""Expand: broadcast the input against the constant ``shape`` input in both directions
(a 1 in the shape keeps the input dim); symbols from a Shape vector (["batch", 3]) pass through."""

from __future__ import annotations

from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import vector
from cuvil_edge.ir.ops._util import broadcast, need, template_function

OP_TYPE = "Expand"
VERSIONS = (8, 13)
CONST_INPUTS = (1,)


def infer(node, inputs, consts=None):
    need(node, inputs, 2)
    shape = vector(node, consts, 1, "shape", symbols=True)
    return [TensorType(inputs[0].dtype, broadcast(node, inputs[0].shape, shape))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_expand(x, shape):
    out = np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))
    return np.array(np.broadcast_to(x, out))
'''

k_expand = template_function(TEMPLATE, "k_expand")


def kernel(node, x, shape):
    return [k_expand(x, shape)]


def emit(node, args, outs):
    return f"{outs[0]} = k_expand({args[0]}, {args[1]})"
