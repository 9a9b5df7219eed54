"""CuvilFusedConv: Conv followed by an activation, one node (made by the activation-fusion pass).

Attributes: those of Conv, plus ``activation`` in :data:`ACTIVATIONS`.  Inference,
reference kernel and cost delegate to :mod:`conv`; the activation is applied to
its result.  Internal op: never in an imported ONNX model.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node
from cuvil_edge.ir.ops import conv
from cuvil_edge.ir.ops._contract import source_of
from cuvil_edge.ir.ops._util import INT, STR, WINDOW_ATTRS, text, window_args
from cuvil_edge.ir.ops.unary import k_gelu, k_hard_swish, k_relu, k_sigmoid

OP_TYPE = "CuvilFusedConv"
VERSIONS = (1,)
ATTRS = {**WINDOW_ATTRS, "group": INT, "activation": STR}

#: Activation name -> the registered op it applies (same kernel, same numerics, same cost);
#: relu6 is Clip(0, 6).
ACTIVATIONS = {"none": None, "relu": "Relu", "relu6": "Clip", "sigmoid": "Sigmoid", "hardswish": "HardSwish",
               "gelu": "Gelu"}


def k_activation(y, activation):
    """The fused activation: the registered ops' own kernels (their sources are in every module)."""
    if activation == "relu":
        return k_relu(y)
    if activation == "relu6":
        return np.clip(y, y.dtype.type(0), y.dtype.type(6))
    if activation == "sigmoid":
        return k_sigmoid(y)
    if activation == "hardswish":
        return k_hard_swish(y)
    if activation == "gelu":
        return k_gelu(y, 0)
    return y


#: Shared with CuvilFusedGemm (identical text, so the code generator pastes it once).
ACTIVATION_TEMPLATE = source_of(k_activation) + "\n"


def activation_flops(name: str, outputs) -> int:
    """FLOPs of the fused activation: the registered op's own count (Clip: 2 per element)."""
    op = ACTIVATIONS[name]
    if op is None:
        return 0
    if op == "Clip":
        return 2 * outputs[0].numel()
    return ops.registry()[op].flops(Node("fused", op, ("y",), ("y",), {}, 20), outputs, outputs)


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
    return conv.flops(node, inputs, outputs) + activation_flops(activation(node), outputs)


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
