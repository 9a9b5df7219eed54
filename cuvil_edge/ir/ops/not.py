"""Not: elementwise logical negation of a bool tensor."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import infer_unary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Not"
VERSIONS = (1,)
TYPES = ((1, frozenset({"bool"})),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_not(x):
    return np.asarray(np.logical_not(x))
'''

k_not = template_function(TEMPLATE, "k_not")


def kernel(node, x):
    return [k_not(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_not({args[0]})"
