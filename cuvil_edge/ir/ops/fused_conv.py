"""CuvilFusedConv: Conv followed by an activation, one node (made by the activation-fusion pass).

Attributes: those of Conv, plus ``activation`` in :data:`ACTIVATIONS`.  Inference,
reference kernel and cost delegate to :mod:`conv`; the activation is applied to
its result.  Internal op: never in an imported ONNX model.
"""

from __future__ import annotations

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir.ops import conv
from cuvil_edge.ir.ops._util import INT, STR, WINDOW_ATTRS, template_function, text, window_args

OP_TYPE = "CuvilFusedConv"
VERSIONS = (1,)
ATTRS = {**WINDOW_ATTRS, "group": INT, "activation": STR}

#: activation -> FLOPs per output element.
ACTIVATIONS = {"none": 0, "relu": 1, "relu6": 2, "sigmoid": 4, "hardswish": 5, "gelu": 12}

#: Shared with CuvilFusedGemm (identical text, so the code generator pastes it once).
#: gelu uses erfc with fractional error < 1.2e-7 (Numerical Recipes' erfcc), in float64.
ACTIVATION_TEMPLATE = '''
def _erfc64(z):
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(poly)
    return np.where(z >= 0, r, 2.0 - r)


def k_activation(y, activation):
    if activation == "relu":
        return np.maximum(y, y.dtype.type(0))
    if activation == "relu6":
        return np.clip(y, y.dtype.type(0), y.dtype.type(6))
    if activation == "sigmoid":
        with np.errstate(over="ignore"):
            return (1.0 / (1.0 + np.exp(-y.astype(np.float64)))).astype(y.dtype)
    if activation == "hardswish":
        return y * np.clip(y / y.dtype.type(6) + y.dtype.type(0.5), y.dtype.type(0), y.dtype.type(1))
    if activation == "gelu":
        y64 = y.astype(np.float64)
        return (0.5 * y64 * _erfc64(-y64 / np.sqrt(2.0))).astype(y.dtype)
    return y
'''

k_activation = template_function(ACTIVATION_TEMPLATE, "k_activation")


def activation(node) -> str:
    """The node's activation name.

    Raises:
        UnsupportedAttributeError: not one of :data:`ACTIVATIONS`.
    """
    value = text(node, "activation", "none")
    if value not in ACTIVATIONS:
        raise UnsupportedAttributeError(f"{node.describe()} activation {value!r} is not one of {sorted(ACTIVATIONS)}")
    return value


def infer(node, inputs):
    activation(node)
    return conv.infer(node, inputs)


def kernel(node, *arrays):
    return [k_activation(conv.kernel(node, *arrays)[0], activation(node))]


def flops(node, inputs, outputs):
    return conv.flops(node, inputs, outputs) + ACTIVATIONS[activation(node)] * outputs[0].numel()


def macs(node, inputs, outputs):
    """Multiply-accumulates of the convolution (bias and activation excluded)."""
    return outputs[0].numel() * inputs[1].numel() // inputs[1].shape[0]


TEMPLATE = conv.TEMPLATE + ACTIVATION_TEMPLATE + '''

def k_fused_conv(x, w, b, strides, pads, dilations, auto_pad, group, activation):
    return k_activation(k_conv(x, w, b, strides, pads, dilations, auto_pad, group), activation)
'''


def emit(node, args, outs):
    b = args[2] if len(args) > 2 and args[2] else "None"
    return (f"{outs[0]} = k_fused_conv({args[0]}, {args[1]}, {b}, {window_args(node)}, "
            f"{int(node.attr('group', 1))}, {activation(node)!r})")
