"""Constant tensors, one table row each (the op contract: ``_contract.py``):

* Constant: a tensor from its one value attribute. The frontend folds these into initializers
  (:func:`value_of`), so a graph normally holds none; the row exists for passes.
* ConstantOfShape: a tensor of the shape the constant input gives, filled with the one-element
  ``value`` attribute (its dtype too); default float32 0. A shape with symbols (["batch", 3])
  keeps them.

Values reach the kernels as literals: Constant's bytes as a hex string; a fill value as a Python
number, or as its text ("nan", "-inf") where it is not finite, which numpy parses.
"""

from __future__ import annotations

import math

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, no_scratch
from cuvil_edge.ir.ops._scratch import constant_scratch
from cuvil_edge.ir.ops._shape import vector
from cuvil_edge.ir.ops._util import FLOAT, FLOATS, INT, INTS, TENSOR, need

_SCALARS = {"value_float": "float32", "value_floats": "float32", "value_int": "int64", "value_ints": "int64"}


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_constant(data, dtype, shape):
    return np.frombuffer(bytes.fromhex(data), dtype=dtype).reshape(shape).copy()


def k_constant_of_shape(shape, value=0.0, dtype="float32"):
    return np.full(tuple(int(d) for d in shape), value, dtype=dtype)


# --- inference and attributes -------------------------------------------------------------------
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
        raise UnsupportedAttributeError(
            f"{node.describe()} attribute {key!r} is not supported; use a numeric 'value' tensor"
        )
    dtypes.from_numpy(array.dtype)
    return array


def _infer_constant(node, inputs):
    need(node, inputs, 0)
    return [TensorType.of(value_of(node))]


def _constant_attrs(node):
    array = value_of(node)
    little = array.astype(array.dtype.newbyteorder("<"))
    return {"data": little.tobytes().hex(), "dtype": little.dtype.str, "shape": tuple(int(d) for d in array.shape)}


def fill(node) -> np.ndarray:
    """ConstantOfShape's fill value as a 0-d array of the output dtype."""
    value = node.attr("value")
    if value is None:
        return np.zeros((), np.float32)
    array = np.asarray(value)
    if array.size != 1:
        raise UnsupportedAttributeError(
            f"{node.describe()}: 'value' must hold exactly one element, got shape {list(array.shape)}"
        )
    dtypes.from_numpy(array.dtype)
    return array.reshape(())


def _infer_constant_of_shape(node, inputs, consts=None):
    need(node, inputs, 1)
    shape = vector(node, consts, 0, "shape", symbols=True)
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ShapeInferenceError(f"{node.describe()}: shape {shape} has a negative dim")
    return [TensorType(dtypes.from_numpy(fill(node).dtype), tuple(shape))]


def _constant_of_shape_attrs(node):
    value = fill(node)
    item = value.item()  # a Python bool, int or float: exact for every dtype the IR has
    if isinstance(item, float) and not math.isfinite(item):
        item = str(item)  # "nan", "inf", "-inf": a literal the generated module can hold
    return {"value": item, "dtype": value.dtype.name}


def _zero(node, inputs, outputs):
    return 0


OPS = (
    OpDef(
        "Constant",
        (1, 9, 11, 12, 13, 19, 21),
        infer=_infer_constant,
        fn=k_constant,
        flops=_zero,
        attrs=_constant_attrs,
        ATTRS={"value": TENSOR, "value_float": FLOAT, "value_floats": FLOATS, "value_int": INT, "value_ints": INTS},
        scratch=constant_scratch,
    ),
    OpDef(
        "ConstantOfShape",
        (9, 20, 21, 23, 24, 25),
        batch=BatchRule("created", data=(), shape=(0,), creates=True),
        infer=_infer_constant_of_shape,
        fn=k_constant_of_shape,
        flops=_zero,
        attrs=_constant_of_shape_attrs,
        ATTRS={"value": TENSOR},
        CONST_INPUTS=(0,),
        torch=_torch.constant_of_shape,
        scratch=no_scratch,
    ),
)
