"""Identity: y = x (the same array; kernels never write into their inputs)."""

from __future__ import annotations

from cuvil_edge.ir.ops._util import need

OP_TYPE = "Identity"
VERSIONS = (1, 13, 14, 16, 19, 21)


def infer(node, inputs):
    need(node, inputs, 1)
    return [inputs[0]]


def kernel(node, x):
    return [x]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_identity(x):
    return x
'''


def emit(node, args, outs):
    return f"{outs[0]} = k_identity({args[0]})"
