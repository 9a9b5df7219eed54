"""HardSigmoid: y = max(0, min(1, alpha * x + beta)), alpha 0.2 and beta 0.5 by default."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import FLOATS, WIDE_TEMPLATE, infer_unary
from cuvil_edge.ir.ops._util import FLOAT, template_function

OP_TYPE = "HardSigmoid"
VERSIONS = (6, 22)  # 22 adds bfloat16 only (not an IR dtype)
ATTRS = {"alpha": FLOAT, "beta": FLOAT}
TYPES = ((6, FLOATS),)


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return 3 * outputs[0].numel()  # multiply-add (2) and the clamp (1)


TEMPLATE = WIDE_TEMPLATE + '''

def k_hard_sigmoid(x, alpha, beta):
    w = _wide(x)
    return np.asarray(np.minimum(np.maximum(w * alpha + beta, 0), 1).astype(x.dtype))
'''

k_hard_sigmoid = template_function(TEMPLATE, "k_hard_sigmoid")


def _params(node):
    return float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))


def kernel(node, x):
    return [k_hard_sigmoid(x, *_params(node))]


def emit(node, args, outs):
    alpha, beta = _params(node)
    return f"{outs[0]} = k_hard_sigmoid({args[0]}, {alpha!r}, {beta!r})"
