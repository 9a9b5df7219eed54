"""Equal: elementwise comparison with broadcasting; the output is bool (NaN compares False)."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import ALL, infer_binary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Equal"
VERSIONS = (7, 11, 13, 19)  # 13 adds bfloat16, 19 string: neither is an IR dtype
TYPES = ((7, frozenset({"bool", "int32", "int64"})), (11, ALL))


def infer(node, inputs):
    return infer_binary(node, inputs, TYPES, out_dtype="bool")


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_equal(a, b):
    return np.asarray(np.equal(a, b))
'''

k_equal = template_function(TEMPLATE, "k_equal")


def kernel(node, a, b):
    return [k_equal(a, b)]


def emit(node, args, outs):
    return f"{outs[0]} = k_equal({args[0]}, {args[1]})"
