"""Sigmoid: y = 1 / (1 + exp(-x)), evaluated as exp(-|x|) so nothing overflows."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, WIDE_TEMPLATE, infer_unary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Sigmoid"
VERSIONS = (6, 13)  # 13 adds bfloat16 only (not an IR dtype)
TYPES = ((6, FLOATS),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return (TRANSCENDENTAL + 3) * outputs[0].numel()  # exp, abs, add, divide


TEMPLATE = WIDE_TEMPLATE + '''

def k_sigmoid(x):
    w = _wide(x)
    e = np.exp(-np.abs(w))
    return np.asarray(np.where(w >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype))
'''

k_sigmoid = template_function(TEMPLATE, "k_sigmoid")


def kernel(node, x):
    return [k_sigmoid(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_sigmoid({args[0]})"
