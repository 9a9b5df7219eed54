"""Div: elementwise a / b with broadcasting.  Integer division truncates toward
zero as C does (-7 / 2 = -3); float division by zero gives inf or NaN."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import ARITH_14, ARITH_OLD, infer_binary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Div"
VERSIONS = (7, 13, 14)  # 13: bfloat16 (not an IR dtype); 14: int8/int16/uint8/uint16
TYPES = ((7, ARITH_OLD), (14, ARITH_14))


def infer(node, inputs):
    return infer_binary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_div(a, b):
    with np.errstate(all="ignore"):
        if a.dtype.kind == "f":
            return np.asarray(np.divide(a, b))
        q = np.floor_divide(a, b)
        if a.dtype.kind == "i":
            q = q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
        return np.asarray(q)
'''

k_div = template_function(TEMPLATE, "k_div")


def kernel(node, a, b):
    return [k_div(a, b)]


def emit(node, args, outs):
    return f"{outs[0]} = k_div({args[0]}, {args[1]})"
