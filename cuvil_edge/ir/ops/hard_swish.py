"""HardSwish: y = x * max(0, min(1, x / 6 + 0.5))."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, WIDE_TEMPLATE, infer_unary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "HardSwish"
VERSIONS = (14, 22)  # 22 adds bfloat16 only (not an IR dtype)
TYPES = ((14, FLOATS),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return 4 * outputs[0].numel()  # multiply-add (2), clamp (1), multiply (1)


TEMPLATE = WIDE_TEMPLATE + '''

def k_hard_swish(x):
    w = _wide(x)
    return np.asarray((w * np.minimum(np.maximum(w * (1 / 6) + 0.5, 0), 1)).astype(x.dtype))
'''

k_hard_swish = template_function(TEMPLATE, "k_hard_swish")


def kernel(node, x):
    return [k_hard_swish(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_hard_swish({args[0]})"
