"""MatMul: numpy matmul semantics (1-D operands promoted, batch dims broadcast)."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import broadcast, need, same_dtype, want_dtype

OP_TYPE = "MatMul"
VERSIONS = (1, 9, 13)


def _split(node, a, b):
    """(batch dims, m, k, n) with None for the m/n of a promoted 1-D operand."""
    if a.rank == 0 or b.rank == 0:
        raise ShapeInferenceError(f"{node.describe()} needs operands of rank >= 1, got {a} and {b}")
    a_shape = (1, *a.shape) if a.rank == 1 else a.shape
    b_shape = (*b.shape, 1) if b.rank == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ShapeInferenceError(f"{node.describe()}: inner dims differ ({a_shape[-1]} vs {b_shape[-2]}) for {a} @ {b}")
    batch = broadcast(node, a_shape[:-2], b_shape[:-2])
    return batch, None if a.rank == 1 else a_shape[-2], a_shape[-1], None if b.rank == 1 else b_shape[-1]


def infer(node, inputs):
    need(node, inputs, 2)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int32", "int64", "uint32", "uint64"})
    batch, m, _, n = _split(node, *inputs)
    return [TensorType(dtype, (*batch, *(d for d in (m, n) if d is not None)))]


def flops(node, inputs, outputs):
    batch, m, k, n = _split(node, *inputs)
    sizes = [d if isinstance(d, int) else 1 for d in (*batch, m or 1, k, n or 1)]
    return 2 * int(np.prod(sizes, dtype=np.int64))


TEMPLATE = '''
def k_mat_mul(a, b):
    return np.asarray(np.matmul(a, b))
'''


def kernel(node, a, b):
    return [np.asarray(np.matmul(a, b))]


def emit(node, args, outs):
    return f"{outs[0]} = k_mat_mul({args[0]}, {args[1]})"
