"""ConstantOfShape: a tensor of the shape given by the constant input, filled with the one-element
``value`` attribute (its dtype too); default float32 0.  A shape with symbols (["batch", 3]) keeps them."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import vector
from cuvil_edge.ir.ops._util import TENSOR, need, template_function

OP_TYPE = "ConstantOfShape"
VERSIONS = (9, 20, 21, 23, 24, 25)
ATTRS = {"value": TENSOR}
CONST_INPUTS = (0,)


def fill(node) -> np.ndarray:
    """The fill value as a 0-d array of the output dtype."""
    value = node.attr("value")
    if value is None:
        return np.zeros((), np.float32)
    array = np.asarray(value)
    if array.size != 1:
        raise UnsupportedAttributeError(f"{node.describe()}: 'value' must hold exactly one element, got shape {list(array.shape)}")
    dtypes.from_numpy(array.dtype)
    return array.reshape(())


def infer(node, inputs, consts=None):
    need(node, inputs, 1)
    shape = vector(node, consts, 0, "shape", symbols=True)
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ShapeInferenceError(f"{node.describe()}: shape {shape} has a negative dim")
    return [TensorType(dtypes.from_numpy(fill(node).dtype), tuple(shape))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_constant_of_shape(shape, value, dtype):
    return np.full(tuple(int(d) for d in shape), value, dtype=dtype)
'''

k_constant_of_shape = template_function(TEMPLATE, "k_constant_of_shape")


def kernel(node, shape):
    value = fill(node)
    return [k_constant_of_shape(shape, value, value.dtype)]


def emit(node, args, outs):
    value = fill(node)
    item = value.item()
    literal = f"float({str(item)!r})" if isinstance(item, float) else repr(item)
    return f"{outs[0]} = k_constant_of_shape({args[0]}, {literal}, {value.dtype.name!r})"
