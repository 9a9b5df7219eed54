"""Sqrt: y = sqrt(x); negative gives NaN, as onnxruntime.  float16 in numpy's ufunc is computed in float32 and rounded once."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, infer_unary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Sqrt"
VERSIONS = (6, 13)  # 13 adds bfloat16 only (not an IR dtype)
TYPES = ((6, FLOATS),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return outputs[0].numel()  # a hardware square root counts as one operation


TEMPLATE = '''
def k_sqrt(x):
    with np.errstate(all="ignore"):
        return np.asarray(np.sqrt(x))
'''

k_sqrt = template_function(TEMPLATE, "k_sqrt")


def kernel(node, x):
    return [k_sqrt(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_sqrt({args[0]})"
