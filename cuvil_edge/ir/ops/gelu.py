"""Gelu (opset 20): y = 0.5 x (1 + erf(x / sqrt 2)), or with approximate="tanh"
y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).  Computed in float64."""

from __future__ import annotations

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir.ops._elementwise import ERF, ERF_TEMPLATE, FLOATS, TRANSCENDENTAL, infer_unary
from cuvil_edge.ir.ops._util import STR, template_function, text

OP_TYPE = "Gelu"
VERSIONS = (20,)
ATTRS = {"approximate": STR}
TYPES = ((20, FLOATS),)


def _tanh(node):
    mode = text(node, "approximate", "none")
    if mode not in ("none", "tanh"):
        raise UnsupportedAttributeError(f"{node.describe()} has approximate={mode!r}; supported: 'none', 'tanh'")
    return int(mode == "tanh")


def infer(node, inputs):
    _tanh(node)
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    per = TRANSCENDENTAL + 7 if _tanh(node) else ERF + 4  # plus the multiplies and adds around it
    return per * outputs[0].numel()


TEMPLATE = ERF_TEMPLATE + '''

def k_gelu(x, tanh):
    w = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        if tanh:
            y = 0.5 * w * (1.0 + np.tanh(0.7978845608028654 * (w + 0.044715 * w * w * w)))
        else:
            y = 0.5 * w * (1.0 + _erf64(w * 0.7071067811865476))
        return np.asarray(y.astype(x.dtype))
'''

k_gelu = template_function(TEMPLATE, "k_gelu")


def kernel(node, x):
    return [k_gelu(x, _tanh(node))]


def emit(node, args, outs):
    return f"{outs[0]} = k_gelu({args[0]}, {_tanh(node)})"
