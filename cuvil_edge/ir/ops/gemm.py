"""Gemm: Y = alpha * A' @ B' + beta * C, with A' = A.T if transA, B' = B.T if transB."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import FLOAT, INT, broadcast, need, same_dtype, template_function, want_dtype

OP_TYPE = "Gemm"
VERSIONS = (7, 9, 11, 13)
ATTRS = {"alpha": FLOAT, "beta": FLOAT, "transA": INT, "transB": INT}


def _mkn(node, a, b):
    if a.rank != 2 or b.rank != 2:
        raise ShapeInferenceError(f"{node.describe()} needs 2-D A and B, got {a} and {b}")
    m, k = reversed(a.shape) if node.attr("transA", 0) else a.shape
    k2, n = reversed(b.shape) if node.attr("transB", 0) else b.shape
    if k != k2:
        raise ShapeInferenceError(f"{node.describe()}: inner dims differ ({k} vs {k2}) for A {a} and B {b}")
    return m, k, n


def infer(node, inputs):
    need(node, inputs, 2, optional=1)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int32", "int64"})
    m, _, n = _mkn(node, inputs[0], inputs[1])
    if len(inputs) > 2 and inputs[2] is not None:
        if broadcast(node, (m, n), inputs[2].shape) != (m, n):
            raise ShapeInferenceError(f"{node.describe()}: C {inputs[2]} does not broadcast to ({m}, {n})")
    return [TensorType(dtype, (m, n))]


def kernel(node, a, b, c=None):
    return [k_gemm(a, b, c, node.attr("alpha", 1.0), node.attr("beta", 1.0),
                   node.attr("transA", 0), node.attr("transB", 0))]


def flops(node, inputs, outputs):
    m, k, n = _mkn(node, inputs[0], inputs[1])
    bias = m * n if len(inputs) > 2 and inputs[2] is not None else 0
    return 2 * m * k * n + bias


TEMPLATE = '''
def k_gemm(a, b, c, alpha, beta, trans_a, trans_b):
    if trans_a:
        a = a.T
    if trans_b:
        b = b.T
    y = a @ b
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if c is not None:
        y = y + (c if beta == 1.0 else c * c.dtype.type(beta))
    return y
'''

k_gemm = template_function(TEMPLATE, "k_gemm")


def emit(node, args, outs):
    c = args[2] if len(args) > 2 and args[2] else "None"
    return (f"{outs[0]} = k_gemm({args[0]}, {args[1]}, {c}, {float(node.attr('alpha', 1.0))!r}, "
            f"{float(node.attr('beta', 1.0))!r}, {int(node.attr('transA', 0))}, {int(node.attr('transB', 0))})")
