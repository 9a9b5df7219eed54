"""Reshape: target shape from the constant ``shape`` input; 0 copies the input dim
(unless allowzero=1, opset >= 14) and one -1 takes what is left, symbols included:
(batch, 16, 4, 4) -> [-1, 256] is (batch, 256).  A target computed from a Shape of
symbolic dims (an object array such as ["batch", -1]) keeps its symbols."""

from __future__ import annotations


from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import dims_product, vector
from cuvil_edge.ir.ops._util import INT, need, template_function

OP_TYPE = "Reshape"
VERSIONS = (5, 13, 14, 19, 21)
ATTRS = {"allowzero": INT}
#: infer needs the value of input 1 (see the registry docstring).
CONST_INPUTS = (1,)


def _target(node, x, shape):
    allowzero = _allowzero(node)
    out = []
    for i, s in enumerate(shape):
        if isinstance(s, str):
            out.append(s)
        elif s == 0 and not allowzero:
            if i >= x.rank:
                raise ShapeInferenceError(f"{node.describe()}: shape entry {i} is 0 but the input {x} has no axis {i}")
            out.append(x.shape[i])
        elif s < -1 or (s == -1 and None in out):
            raise ShapeInferenceError(f"{node.describe()}: bad target shape {shape} (one -1 at most, no other negatives)")
        else:
            out.append(None if s == -1 else s)
    return out


def infer(node, inputs, consts=None):
    need(node, inputs, 2)
    x, value = inputs[0], (consts or {}).get(1)
    if value is None or value.dtype.kind not in "iO" or value.ndim != 1:
        raise ShapeInferenceError(f"{node.describe()}: the shape input must be a 1-D int64 initializer or Constant")
    shape = vector(node, consts, 1, "shape", symbols=True)
    out = _target(node, x, shape)
    in_size, in_syms = dims_product(x.shape)
    out_size, out_syms = dims_product(d for d in out if d is not None)
    left = in_syms - out_syms
    if out_syms - in_syms:
        raise ShapeInferenceError(f"{node.describe()}: target {out} names symbols the input {x} lacks")
    if None in out:
        if out_size == 0 or in_size % out_size or (left and (len(left) > 1 or in_size != out_size)):
            raise ShapeInferenceError(
                f"{node.describe()}: cannot resolve -1 reshaping {x} to {shape}; "
                "the target hard-codes sizes that depend on a symbolic dim (fix that dim, or use 0 to copy it)")
        out[out.index(None)] = next(iter(left)) if left else in_size // out_size
    elif left or in_size != out_size:
        raise ShapeInferenceError(f"{node.describe()}: cannot reshape {x} to {out}; element counts differ or depend on a symbol")
    return [TensorType(x.dtype, tuple(out))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_reshape(x, shape, allowzero):
    shape = [int(s) for s in shape]
    if not allowzero:
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)
'''

k_reshape = template_function(TEMPLATE, "k_reshape")


def _allowzero(node):
    return int(node.attr("allowzero", 0)) if node.version >= 14 else 0


def kernel(node, x, shape):
    return [k_reshape(x, shape, _allowzero(node))]


def emit(node, args, outs):
    return f"{outs[0]} = k_reshape({args[0]}, {args[1]}, {_allowzero(node)})"
