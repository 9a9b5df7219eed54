"""Relu: y = max(x, 0)."""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir import dtypes
from cuvil_edge.ir.ops._util import need, want_dtype

OP_TYPE = "Relu"
VERSIONS = (6, 13, 14)


def infer(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int8", "int32", "int64"})
    return [inputs[0]]


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
