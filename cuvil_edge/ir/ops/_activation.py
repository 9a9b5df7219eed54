"""The activations that fusion folds into Conv and Gemm (``passes/fuse_activation.py``).

A fused node applies *the registered op's own kernel* to its result (Relu and relu6 as the same
ufuncs, in place: the result is the fused kernel's own array), so a fused model computes
exactly what the unfused one does and costs what it costs. ``k_conv`` and ``k_gemm`` end with
``_activate`` when their ``activation`` attribute is not ``"none"``; at a call site specialised for
``activation="none"`` the call is pruned away.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node
from cuvil_edge.ir.ops._elementwise import _erf64, _wide
from cuvil_edge.ir.ops._native import _native_lib, _native_map
from cuvil_edge.ir.ops._util import text
from cuvil_edge.ir.ops.activation import k_gelu, k_hard_swish, k_sigmoid
from cuvil_edge.ir.ops.swish import k_swish

#: Activation name -> the registered op it applies; relu6 is Clip(0, 6).
ACTIVATIONS = {
    "none": None,
    "relu": "Relu",
    "relu6": "Clip",
    "sigmoid": "Sigmoid",
    "hardswish": "HardSwish",
    "gelu": "Gelu",
    "swish": "Swish",
}


def _activate(y, activation):
    # y is the calling kernel's own result, so Relu and Clip(0, 6) overwrite it: the same ufuncs as
    # k_relu and Clip, without a second output-sized array
    if activation == "relu":
        return np.maximum(y, y.dtype.type(0), out=y)
    if activation == "relu6":
        return np.clip(y, y.dtype.type(0), y.dtype.type(6), out=y)
    if activation == "sigmoid":
        return k_sigmoid(y)
    if activation == "hardswish":
        return k_hard_swish(y)
    if activation == "gelu":
        return k_gelu(y, 0)
    if activation == "swish":
        return k_swish(y, 1.0)
    return y


#: What a kernel that ends with ``_activate`` lists as helpers (callees first).
HELPERS = (_wide, _erf64, _native_lib, _native_map, k_sigmoid, k_hard_swish, k_gelu, k_swish, _activate)


def activation(node: Node) -> str:
    """The node's ``activation`` attribute (``"none"`` when absent).

    Raises:
        UnsupportedAttributeError: not one of :data:`ACTIVATIONS`.
    """
    value = text(node, "activation", "none")
    if value not in ACTIVATIONS:
        raise UnsupportedAttributeError(f"{node.describe()} activation {value!r} is not one of {sorted(ACTIVATIONS)}")
    return value


def activation_flops(name: str, outputs) -> int:
    """FLOPs of the fused activation: the registered op's own count (Clip: 2 per element)."""
    op = ACTIVATIONS[name]
    if op is None:
        return 0
    if op == "Clip":
        return 2 * outputs[0].numel()
    return ops.registry()[op].flops(Node("fused", op, ("y",), ("y",), {}, 20), outputs, outputs)
