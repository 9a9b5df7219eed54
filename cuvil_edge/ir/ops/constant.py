"""Constant: a tensor from an attribute.  The frontend folds these into
initializers, so a graph normally holds none; the module exists for passes and
for the frontend's folding (``value_of``)."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import FLOAT, FLOATS, INT, INTS, TENSOR, need

OP_TYPE = "Constant"
VERSIONS = (1, 9, 11, 12, 13, 19, 21)
ATTRS = {"value": TENSOR, "value_float": FLOAT, "value_floats": FLOATS, "value_int": INT, "value_ints": INTS}

_SCALARS = {"value_float": "float32", "value_floats": "float32", "value_int": "int64", "value_ints": "int64"}


def value_of(node) -> np.ndarray:
    """The tensor the node's single value attribute holds.

    Raises:
        UnsupportedAttributeError: no attribute, several, or an unsupported kind/dtype.
    """
    present = [key for key in node.attrs if key == "value" or key.startswith("value_") or key == "sparse_value"]
    if len(present) != 1:
        raise UnsupportedAttributeError(f"{node.describe()} needs exactly one value attribute, got {present}")
    key = present[0]
    if key == "value" and isinstance(node.attrs[key], np.ndarray):
        array = node.attrs[key]
    elif key in _SCALARS:
        array = np.asarray(node.attrs[key], dtype=_SCALARS[key])
    else:
        raise UnsupportedAttributeError(f"{node.describe()} attribute {key!r} is not supported; use a numeric 'value' tensor")
    dtypes.from_numpy(array.dtype)
    return array


def infer(node, inputs):
    need(node, inputs, 0)
    return [TensorType.of(value_of(node))]


def kernel(node):
    return [value_of(node)]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_constant(data, dtype, shape):
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
'''


def emit(node, args, outs):
    array = value_of(node)
    little = array.astype(array.dtype.newbyteorder("<"))
    return f"{outs[0]} = k_constant({little.tobytes()!r}, {little.dtype.str!r}, {array.shape!r})"
