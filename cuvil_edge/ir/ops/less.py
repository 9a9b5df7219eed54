"""Less: elementwise comparison with broadcasting; the output is bool (NaN compares False)."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, INTS, infer_binary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Less"
VERSIONS = (7, 9, 13)  # 13 adds bfloat16 only (not an IR dtype)
TYPES = ((7, FLOATS), (9, FLOATS | INTS))


def infer(node, inputs):
    return infer_binary(node, inputs, TYPES, out_dtype="bool")


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_less(a, b):
    return np.asarray(np.less(a, b))
'''

k_less = template_function(TEMPLATE, "k_less")


def kernel(node, a, b):
    return [k_less(a, b)]


def emit(node, args, outs):
    return f"{outs[0]} = k_less({args[0]}, {args[1]})"
