"""Log: y = ln(x); negative gives NaN and 0 gives -inf, as onnxruntime.  float16 in numpy's ufunc is computed in float32 and rounded once."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, infer_unary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Log"
VERSIONS = (6, 13)  # 13 adds bfloat16 only (not an IR dtype)
TYPES = ((6, FLOATS),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return TRANSCENDENTAL * outputs[0].numel()  # one transcendental per element (see _elementwise)


TEMPLATE = '''
def k_log(x):
    with np.errstate(all="ignore"):
        return np.asarray(np.log(x))
'''

k_log = template_function(TEMPLATE, "k_log")


def kernel(node, x):
    return [k_log(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_log({args[0]})"
