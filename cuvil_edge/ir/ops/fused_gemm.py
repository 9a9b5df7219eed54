"""CuvilFusedGemm: Gemm followed by an activation, one node (made by the activation-fusion pass).

Attributes: those of Gemm, plus ``activation`` (see :mod:`fused_conv`).  Inference,
reference kernel and cost delegate to :mod:`gemm`.  Internal op: never in an imported ONNX model.
"""

from __future__ import annotations

from cuvil_edge.ir.ops import gemm
from cuvil_edge.ir.ops.fused_conv import ACTIVATION_TEMPLATE, activation, activation_flops, k_activation
from cuvil_edge.ir.ops._util import FLOAT, INT, STR

OP_TYPE = "CuvilFusedGemm"
VERSIONS = (1,)
ATTRS = {"alpha": FLOAT, "beta": FLOAT, "transA": INT, "transB": INT, "activation": STR}


def infer(node, inputs):
    activation(node)
    return gemm.infer(node, inputs)


def kernel(node, *arrays):
    return [k_activation(gemm.kernel(node, *arrays)[0], activation(node))]


def flops(node, inputs, outputs):
    return gemm.flops(node, inputs, outputs) + activation_flops(activation(node), outputs)


def macs(node, inputs, outputs):
    """Multiply-accumulates of A' @ B' (bias and activation excluded)."""
    m, k, n = gemm._mkn(node, inputs[0], inputs[1])
    return m * k * n


TEMPLATE = gemm.TEMPLATE + ACTIVATION_TEMPLATE + '''

def k_fused_gemm(a, b, c, alpha, beta, trans_a, trans_b, activation):
    return k_activation(k_gemm(a, b, c, alpha, beta, trans_a, trans_b), activation)
'''


def emit(node, args, outs):
    c = args[2] if len(args) > 2 and args[2] else "None"
    return (f"{outs[0]} = k_fused_gemm({args[0]}, {args[1]}, {c}, {float(node.attr('alpha', 1.0))!r}, "
            f"{float(node.attr('beta', 1.0))!r}, {int(node.attr('transA', 0))}, {int(node.attr('transB', 0))}, "
            f"{activation(node)!r})")
