"""GlobalMaxPool: max over every spatial axis, kept as size-1 dims."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import need, template_function, want_dtype

OP_TYPE = "GlobalMaxPool"
VERSIONS = (1, 22)


def infer(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want_dtype(node, x, dtypes.FLOATS)
    if x.rank < 3:
        raise ShapeInferenceError(f"{node.describe()} needs (N, C, *spatial), got {x}")
    return [TensorType(x.dtype, (*x.shape[:2], *([1] * (x.rank - 2))))]


def flops(node, inputs, outputs):
    return inputs[0].numel()


TEMPLATE = '''
def k_global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)
'''

k_global_max_pool = template_function(TEMPLATE, "k_global_max_pool")


def kernel(node, x):
    return [k_global_max_pool(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_global_max_pool({args[0]})"
