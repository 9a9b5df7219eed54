"""Erf: the error function, by Cody's rational approximations in float64 (see
_elementwise.ERF_TEMPLATE), rounded once to the input dtype.  Opset 9 also
allows integer dtypes (the result is truncated back to the integer dtype, as
ONNX's reference does); 13 allows floats only."""

from __future__ import annotations

from cuvil_edge.ir.ops._elementwise import ERF, ERF_TEMPLATE, FLOATS, INTS, infer_unary
from cuvil_edge.ir.ops._util import template_function

OP_TYPE = "Erf"
VERSIONS = (9, 13)
TYPES = ((9, FLOATS | INTS), (13, FLOATS))


def infer(node, inputs):
    return infer_unary(node, inputs, TYPES)


def flops(node, inputs, outputs):
    return ERF * outputs[0].numel()  # rational approximation plus an exp (see _elementwise)


TEMPLATE = ERF_TEMPLATE + '''

def k_erf(x):
    return np.asarray(_erf64(x).astype(x.dtype))
'''

k_erf = template_function(TEMPLATE, "k_erf")


def kernel(node, x):
    return [k_erf(x)]


def emit(node, args, outs):
    return f"{outs[0]} = k_erf({args[0]})"
