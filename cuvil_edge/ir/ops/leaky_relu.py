"""LeakyRelu: y = x for x >= 0, alpha * x otherwise (alpha default 0.01)."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, WIDE_TEMPLATE, infer_unary
from cuvil_edge.ir.ops._util import FLOAT, template_function

OP_TYPE = "LeakyRelu"
VERSIONS = (6, 16)  # 16 adds bfloat16 only (not an IR dtype)
ATTRS = {"alpha": FLOAT}
TYPES = ((6, FLOATS),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = WIDE_TEMPLATE + '''

def k_leaky_relu(x, alpha):
    w = _wide(x)
    return np.asarray(np.where(w >= 0, w, w * alpha).astype(x.dtype))
'''

k_leaky_relu = template_function(TEMPLATE, "k_leaky_relu")


def _alpha(node):
    return float(node.attr("alpha", 0.01))


def kernel(node, x):
    return [k_leaky_relu(x, _alpha(node))]


def emit(node, args, outs):
    return f"{outs[0]} = k_leaky_relu({args[0]}, {_alpha(node)!r})"
