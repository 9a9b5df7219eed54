"""Mul: elementwise a * b with numpy multidirectional broadcasting, any int or float dtype."""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import broadcast, need, same_dtype, want_dtype

OP_TYPE = "Mul"
VERSIONS = (7, 13, 14)
NUMERIC = dtypes.SUPPORTED - {"bool"}


def infer(node, inputs):
    need(node, inputs, 2)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], NUMERIC)
    return [TensorType(dtype, broadcast(node, inputs[0].shape, inputs[1].shape))]


def kernel(node, a, b):
    return [np.asarray(np.multiply(a, b))]


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_mul(a, b):
    return np.asarray(np.multiply(a, b))
'''


def emit(node, args, outs):
    return f"{outs[0]} = k_mul({args[0]}, {args[1]})"
