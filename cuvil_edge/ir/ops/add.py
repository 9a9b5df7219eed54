"""Add: elementwise a + b with numpy multidirectional broadcasting, int and float dtypes as ONNX allows per opset."""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.ops._elementwise import ARITH_14, ARITH_OLD, infer_binary

OP_TYPE = "Add"
VERSIONS = (7, 13, 14)  # 13: bfloat16 (not an IR dtype); 14: int8/int16/uint8/uint16
TYPES = ((7, ARITH_OLD), (14, ARITH_14))


def infer(node, inputs):
    return infer_binary(node, inputs, TYPES)


def kernel(node, a, b):
    return [np.asarray(np.add(a, b))]


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_add(a, b):
    return np.asarray(np.add(a, b))
'''


def emit(node, args, outs):
    return f"{outs[0]} = k_add({args[0]}, {args[1]})"
