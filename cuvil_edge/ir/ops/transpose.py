"""Transpose: permute axes by ``perm`` (default: reverse them); symbols move with their axis."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import INTS, ints, need, template_function

OP_TYPE = "Transpose"
VERSIONS = (1, 13, 21, 23, 24, 25)
ATTRS = {"perm": INTS}


def _perm(node, rank):
    perm = ints(node, "perm") or list(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ShapeInferenceError(f"{node.describe()}: perm {perm} is not a permutation of 0..{rank - 1}")
    return perm


def infer(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    return [TensorType(x.dtype, tuple(x.shape[p] for p in _perm(node, x.rank)))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_transpose(x, perm):
    return np.ascontiguousarray(np.transpose(x, perm or None))
'''

k_transpose = template_function(TEMPLATE, "k_transpose")


def kernel(node, x):
    return [k_transpose(x, tuple(ints(node, "perm")))]


def emit(node, args, outs):
    return f"{outs[0]} = k_transpose({args[0]}, {tuple(ints(node, 'perm'))!r})"
