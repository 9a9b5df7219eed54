"""GlobalMaxPool: max over every spatial axis, kept as size-1 dims."""

from __future__ import annotations

from cuvil_edge.ir.ops._util import template_function
from cuvil_edge.ir.ops import global_average_pool as _average

OP_TYPE = "GlobalMaxPool"
VERSIONS = (1, 22)

infer = _average.infer  # same output type as GlobalAveragePool


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
