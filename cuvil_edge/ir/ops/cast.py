"""Cast: convert to the dtype named by attribute ``to`` (an ONNX TensorProto
code).  Floats to integers truncate toward zero, anything to bool is "!= 0"
(NaN is True), float narrowing rounds to nearest even; out-of-range values are
undefined in ONNX.  ``saturate`` (19+) only affects float8, which the IR lacks."""

from __future__ import annotations

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._elementwise import ALL, infer_unary
from cuvil_edge.ir.ops._util import INT, template_function

OP_TYPE = "Cast"
#: 9 string, 13 bfloat16, 19 float8 + saturate, 21 int4/uint4, 23 float4, 24 float8e8m0,
#: 25 int2/uint2, 28 float6: none of them IR dtypes, so the semantics here never change.
VERSIONS = (6, 9, 13, 19, 21, 23, 24, 25, 28)
ATTRS = {"to": INT, "saturate": INT}
TYPES = ((6, ALL),)


def _to(node):
    code = node.attr("to")
    name = dtypes.FROM_ONNX_CODE.get(code) if isinstance(code, int) else None
    if name is None:
        raise UnsupportedAttributeError(
            f"{node.describe()} casts to ONNX type {code!r}, which the IR does not support; supported: "
            + ", ".join(f"{c} ({n})" for c, n in sorted(dtypes.FROM_ONNX_CODE.items())))
    return name


def infer(node, inputs):
    (x,) = infer_unary(node, inputs, TYPES)
    return [TensorType(_to(node), x.shape)]


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_cast(x, dtype):
    with np.errstate(all="ignore"):
        return np.asarray(x.astype(dtype))
'''

k_cast = template_function(TEMPLATE, "k_cast")


def kernel(node, x):
    return [k_cast(x, _to(node))]


def emit(node, args, outs):
    return f"{outs[0]} = k_cast({args[0]}, {_to(node)!r})"
