"""Where: y = x where condition else y, the three inputs broadcast together."""

from __future__ import annotations

from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._elementwise import ALL, broadcast_all, want
from cuvil_edge.ir.ops._util import need, same_dtype, template_function

OP_TYPE = "Where"
VERSIONS = (9, 16)  # 16 adds bfloat16 only (not an IR dtype)
TYPES = ((9, ALL),)
BOOL = ((9, frozenset({"bool"})),)


def infer(node, inputs):
    need(node, inputs, 3)
    want(node, inputs[0], BOOL, "condition")
    dtype = same_dtype(node, inputs[1:])
    want(node, inputs[1], TYPES)
    return [TensorType(dtype, broadcast_all(node, [t.shape for t in inputs]))]


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_where(c, x, y):
    return np.asarray(np.where(c, x, y))
'''

k_where = template_function(TEMPLATE, "k_where")


def kernel(node, c, x, y):
    return [k_where(c, x, y)]


def emit(node, args, outs):
    return f"{outs[0]} = k_where({args[0]}, {args[1]}, {args[2]})"
