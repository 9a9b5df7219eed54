"""Sub: elementwise a - b with numpy multidirectional broadcasting (integers wrap)."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import ARITH_14, ARITH_OLD, infer_binary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Sub"
VERSIONS = (7, 13, 14)  # 13: bfloat16 (not an IR dtype); 14: int8/int16/uint8/uint16
TYPES = ((7, ARITH_OLD), (14, ARITH_14))


def infer(node, inputs):
    return infer_binary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_sub(a, b):
    with np.errstate(all="ignore"):
        return np.asarray(np.subtract(a, b))
'''

k_sub = template_function(TEMPLATE, "k_sub")


def kernel(node, a, b):
    return [k_sub(a, b)]


def emit(node, args, outs):
    return f"{outs[0]} = k_sub({args[0]}, {args[1]})"
