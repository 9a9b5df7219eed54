"""Ops that generate tensors (ONNX's generator category), one table row each (the op contract:
``_contract.py``):

* Constant: a tensor from its one value attribute. The frontend folds these into initializers
  (:func:`value_of`), so a graph normally holds none; the row exists for passes.
* ConstantOfShape: a tensor of the shape the constant input gives, filled with the one-element
  ``value`` attribute (its dtype too); default float32 0. A shape with symbols (["batch", 3])
  keeps them.
* EyeLike: a 2-D tensor of its input's shape, ones on diagonal ``k`` and zeros elsewhere, of
  ``dtype`` (the input's by default).
* Range: start, start + delta, ... up to limit (excluded). The three scalar inputs must be
  constants, since they decide the length; a symbolic bound (``torch.arange(batch)``) gives a
  symbolic length.

Values reach the kernels as literals: Constant's bytes as a hex string; a fill value as a Python
number, or as its text ("nan", "-inf") where it is not finite, which numpy parses.
"""

from __future__ import annotations

import math

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dims, dtypes
from cuvil_edge.ir.dims import Expr
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, no_scratch, per_element
from cuvil_edge.ir.ops._elementwise import ALL, want
from cuvil_edge.ir.ops._scratch import constant_scratch
from cuvil_edge.ir.ops._shape import scalar, vector
from cuvil_edge.ir.ops._util import FLOAT, FLOATS, INT, INTS, TENSOR, need

_SCALARS = {"value_float": "float32", "value_floats": "float32", "value_int": "int64", "value_ints": "int64"}
#: EyeLike's dtypes (the IR's numeric types and bool).
EYE = ALL


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_constant(data, dtype, shape):
    return np.frombuffer(bytes.fromhex(data), dtype=dtype).reshape(shape).copy()


def k_constant_of_shape(shape, value=0.0, dtype="float32"):
    return np.full(tuple(int(d) for d in shape), value, dtype=dtype)


def k_eye_like(x, k, dtype):
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=x.dtype if dtype is None else dtype)


def k_range(start, limit, delta):
    s, d = start.reshape(()), delta.reshape(())
    n = max(int(np.ceil((float(limit.reshape(())) - float(s)) / float(d))), 0)
    return (s + np.arange(n).astype(start.dtype) * d).astype(start.dtype)


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


def _eye_dtype(node):
    code = node.attr("dtype")
    if code is None:
        return None
    name = dtypes.FROM_ONNX_CODE.get(int(code))
    if name is None:
        raise UnsupportedAttributeError(f"{node.describe()}: dtype {code} is not an IR dtype")
    return name


def _infer_eye_like(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((9, EYE),))
    if x.rank != 2:
        raise ShapeInferenceError(f"{node.describe()} needs a 2-D input, got {x}")
    return [TensorType(_eye_dtype(node) or x.dtype, x.shape)]


def _symbolic_count(node, dtype: str, start, limit, delta):
    """How many values ``range(start, limit, delta)`` has when a bound is a symbolic dim
    (``torch.arange(batch)``: ``batch``); the step must be a nonzero integer."""
    if dtype not in ("int16", "int32", "int64") or isinstance(delta, str) or not delta:
        raise ShapeInferenceError(
            f"{node.describe()}: a Range over the symbolic dim {start!r}..{limit!r} needs an "
            f"integer type and a constant nonzero integer step, got {dtype} step {delta!r}"
        )
    step = int(delta)
    span = (Expr.of(limit) - Expr.of(start)) if step > 0 else (Expr.of(start) - Expr.of(limit))
    count = dims.floordiv(span + (abs(step) - 1), Expr.const(abs(step)))
    return dims.maximum(count, Expr.const(0)).to_dim()


def _infer_range(node, inputs, consts=None):
    need(node, inputs, 3)
    dtype = inputs[0].dtype
    want(node, inputs[0], ((11, dtypes.FLOATS | {"int16", "int32", "int64"}),))
    if any(t.dtype != dtype or t.rank != 0 for t in inputs):
        raise ShapeInferenceError(f"{node.describe()}: start, limit and delta must be scalars of one dtype")
    scalars = [scalar(node, consts, i, w).item() for i, w in enumerate(("start", "limit", "delta"))]
    if any(isinstance(s, str) for s in scalars):
        return [TensorType(dtype, (_symbolic_count(node, dtype, *scalars),))]
    start, limit, delta = (float(s) for s in scalars)
    if delta == 0:
        raise ShapeInferenceError(f"{node.describe()}: delta is 0")
    return [TensorType(dtype, (max(int(math.ceil((limit - start) / delta)), 0),))]


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
    OpDef(
        "EyeLike",
        (9, 22),
        infer=_infer_eye_like,
        fn=k_eye_like,
        flops=per_element(0),
        attrs=lambda node: {"k": int(node.attr("k", 0)), "dtype": _eye_dtype(node)},
        ATTRS={"k": INT, "dtype": INT},
    ),
    OpDef(
        "Range",
        (11,),
        infer=_infer_range,
        fn=k_range,
        flops=per_element(2),
        CONST_INPUTS=(0, 1, 2),
        torch=_torch.range_,
    ),
)
