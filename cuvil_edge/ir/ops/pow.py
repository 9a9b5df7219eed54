"""Pow: z = x ** y with broadcasting; z has x's dtype.  Opset 7 needs float x
and y of one dtype; from 12 x may be int32/int64 and y any int or float dtype.
Evaluated as C's pow on doubles, then converted to x's dtype (integers truncate
toward zero: 2 ** -1 = 0), which is what onnxruntime does."""

from __future__ import annotations

from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._elementwise import FLOATS, INTS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._util import broadcast, need, same_dtype, template_function

OP_TYPE = "Pow"
VERSIONS = (7, 12, 13, 15)  # 13, 15: bfloat16 only (not an IR dtype)
BASE = ((7, FLOATS), (12, FLOATS | {"int32", "int64"}))
EXPONENT = ((7, FLOATS), (12, FLOATS | INTS))


def infer(node, inputs):
    need(node, inputs, 2)
    if node.version < 12:
        same_dtype(node, inputs)
    want(node, inputs[0], BASE, "base")
    want(node, inputs[1], EXPONENT, "exponent")
    return [TensorType(inputs[0].dtype, broadcast(node, inputs[0].shape, inputs[1].shape))]


def flops(node, inputs, outputs):
    return 2 * TRANSCENDENTAL * outputs[0].numel()  # exp(y * log(x))


TEMPLATE = '''
def k_pow(x, y):
    with np.errstate(all="ignore"):
        z = np.power(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
        return np.asarray(z.astype(x.dtype))
'''

k_pow = template_function(TEMPLATE, "k_pow")


def kernel(node, x, y):
    return [k_pow(x, y)]


def emit(node, args, outs):
    return f"{outs[0]} = k_pow({args[0]}, {args[1]})"
