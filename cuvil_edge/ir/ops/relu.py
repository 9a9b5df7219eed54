"""Relu: y = max(x, 0)."""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.ops._elementwise import FLOATS, SIGNED, infer_unary

OP_TYPE = "Relu"
VERSIONS = (6, 13, 14)  # 13: bfloat16 (not an IR dtype); 14: int8/int16/int32/int64
TYPES = ((6, FLOATS), (14, FLOATS | SIGNED))


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def kernel(node, x):
    return [np.maximum(x, x.dtype.type(0))]


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_relu(x):
    return np.maximum(x, x.dtype.type(0))
'''


def emit(node, args, outs):
    return f"{outs[0]} = k_relu({args[0]})"
