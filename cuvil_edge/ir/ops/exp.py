"""Exp: y = exp(x) (overflow gives inf, as onnxruntime).  float16 in numpy's ufunc is computed in float32 and rounded once."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, infer_unary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Exp"
VERSIONS = (6, 13)  # 13 adds bfloat16 only (not an IR dtype)
TYPES = ((6, FLOATS),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return TRANSCENDENTAL * outputs[0].numel()  # one transcendental per element (see _elementwise)


TEMPLATE = '''
def k_exp(x):
    with np.errstate(all="ignore"):
        return np.asarray(np.exp(x))
'''

k_exp = template_function(TEMPLATE, "k_exp")


def kernel(node, x):
    return [k_exp(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_exp({args[0]})"
