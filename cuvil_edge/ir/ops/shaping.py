"""Ops whose output shape comes from a constant input or a scale, one table row each (the op
contract: ``_contract.py``): Tile, Range, TopK, Hardmax, Upsample. The constant inputs they need
for inference are listed in ``CONST_INPUTS`` (initializers, Constants or shape computations).
"""

from __future__ import annotations

import math

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dims
from cuvil_edge.ir.dims import Expr
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, no_scratch, per_element
from cuvil_edge.ir.ops._elementwise import ALL, FLOATS, INTS, want
from cuvil_edge.ir.ops._scratch import upsample_scratch
from cuvil_edge.ir.ops._shape import vector
from cuvil_edge.ir.ops._util import FLOATS as FLOAT_LIST, INT, STR, axis_index, choice, need, required


def k_tile(x, repeats):
    return np.tile(x, [int(r) for r in np.asarray(repeats).reshape(-1)])


def k_range(start, limit, delta):
    s, d = start.reshape(()), delta.reshape(())
    n = max(int(np.ceil((float(limit.reshape(())) - float(s)) / float(d))), 0)
    return (s + np.arange(n).astype(start.dtype) * d).astype(start.dtype)


def k_topk(x, k, axis, largest, sorted_):
    kk = int(np.asarray(k).reshape(-1)[0])
    n = x.shape[axis]
    if largest:  # descending; among equal values the lower index first
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    index = np.take(order, np.arange(kk), axis=axis).astype(np.int64)
    return np.take_along_axis(x, index, axis=axis), index


def k_hardmax(x, axis, flatten):
    w = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1) if flatten else x
    a = 1 if flatten else axis + x.ndim if axis < 0 else axis
    first = np.expand_dims(np.argmax(w, axis=a), a)
    out = (np.arange(w.shape[a]).reshape([-1 if i == a else 1 for i in range(w.ndim)]) == first).astype(x.dtype)
    return out.reshape(x.shape)


def k_upsample(x, scales, linear):
    out = x
    for axis, s in enumerate(np.asarray(scales, dtype=np.float64).reshape(-1)):
        size = x.shape[axis]
        new = int(np.floor(size * float(s)))
        src = np.arange(new, dtype=np.float64) / float(s)  # asymmetric: out index / scale
        if not linear:
            out = np.take(out, np.minimum(np.floor(src).astype(np.int64), size - 1), axis=axis)
            continue
        lo = np.minimum(np.floor(src).astype(np.int64), size - 1)
        hi = np.minimum(lo + 1, size - 1)
        frac = (src - lo).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
        w = out.astype(np.float64)
        out = np.take(w, lo, axis=axis) * (1 - frac) + np.take(w, hi, axis=axis) * frac
    return np.asarray(out).astype(x.dtype)


# --- inference and attributes -------------------------------------------------------------------
def _scalar(node, consts, index, what):
    value = (consts or {}).get(index)
    if value is None or np.asarray(value).size != 1:
        raise ShapeInferenceError(f"{node.describe()}: {what} must be a constant scalar; it decides the output shape")
    return np.asarray(value).reshape(())


def _infer_tile(node, inputs, consts=None):
    need(node, inputs, 2)
    x = inputs[0]
    reps = vector(node, consts, 1, "repeats", symbols=True)
    if len(reps) != x.rank or any(isinstance(r, int) and r < 0 for r in reps):
        raise ShapeInferenceError(f"{node.describe()}: repeats {reps} must give one count >= 0 per axis of {x}")
    return [TensorType(x.dtype, tuple(dims.product((d, r)) for d, r in zip(x.shape, reps, strict=True)))]


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
    want(node, inputs[0], ((11, FLOATS | {"int16", "int32", "int64"}),))
    if any(t.dtype != dtype or t.rank != 0 for t in inputs):
        raise ShapeInferenceError(f"{node.describe()}: start, limit and delta must be scalars of one dtype")
    scalars = [_scalar(node, consts, i, w).item() for i, w in enumerate(("start", "limit", "delta"))]
    if any(isinstance(s, str) for s in scalars):
        return [TensorType(dtype, (_symbolic_count(node, dtype, *scalars),))]
    start, limit, delta = (float(s) for s in scalars)
    if delta == 0:
        raise ShapeInferenceError(f"{node.describe()}: delta is 0")
    return [TensorType(dtype, (max(int(math.ceil((limit - start) / delta)), 0),))]


def _topk_attrs(node):
    return {
        "axis": int(node.attr("axis", -1)),
        "largest": int(node.attr("largest", 1)) if node.version >= 11 else 1,
        "sorted_": int(node.attr("sorted", 1)) if node.version >= 11 else 1,
    }


def _infer_topk(node, inputs, consts=None):
    x = inputs[0]
    want(node, x, ((1, FLOATS), (11, FLOATS | INTS)))
    axis = axis_index(node, int(node.attr("axis", -1)), x.rank)
    if node.version < 10:
        need(node, inputs, 1)
        k = node.attr("k")
    else:
        need(node, inputs, 2)
        k = _scalar(node, consts, 1, "k")
        if inputs[1].dtype != "int64" or k.dtype.kind not in "iu":
            raise ShapeInferenceError(f"{node.describe()}: K must be an int64 tensor of one element, got {inputs[1]}")
        k = int(k)
    if not isinstance(k, int) or k < 0 or (isinstance(x.shape[axis], int) and k > x.shape[axis]):
        raise ShapeInferenceError(f"{node.describe()}: k={k!r} must be in [0, {x.shape[axis]}]")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return [TensorType(x.dtype, shape), TensorType("int64", shape)]


def _topk_kernel_attrs(node):
    out = _topk_attrs(node)
    if node.version < 10:
        out["k"] = int(required(node, "k"))
    return out


def _hardmax_attrs(node):
    return {"axis": int(node.attr("axis", 1 if node.version < 13 else -1)), "flatten": node.version < 13}


def _infer_hardmax(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((1, FLOATS),))
    a = _hardmax_attrs(node)
    axis_index(node, a["axis"], x.rank, extra=1 if a["flatten"] else 0)
    return [x]


def _upsample_mode(node):
    return choice(node, "mode", "nearest", ("nearest", "linear")) == "linear"


def _upsample_scales(node, consts):
    if node.version < 9:
        scales = node.attr("scales")
    else:
        value = (consts or {}).get(1)
        scales = None if value is None else np.asarray(value, dtype=np.float64).reshape(-1).tolist()
    if not scales:
        raise ShapeInferenceError(f"{node.describe()}: scales must be an attribute (opset 7) or a constant input")
    return [float(s) for s in scales]


def _infer_upsample(node, inputs, consts=None):
    need(node, inputs, 1 if node.version < 9 else 2)
    x = inputs[0]
    want(node, x, ((7, ALL),))
    _upsample_mode(node)
    scales = _upsample_scales(node, consts)
    if len(scales) != x.rank or any(s < 1 for s in scales):
        raise ShapeInferenceError(f"{node.describe()}: scales {scales} must give one factor >= 1 per axis of {x}")
    shape = []
    for d, s in zip(x.shape, scales, strict=True):
        if not isinstance(d, int) and s != 1:
            raise ShapeInferenceError(f"{node.describe()}: cannot scale the symbolic dim {d!r}")
        shape.append(int(math.floor(d * s)) if isinstance(d, int) else d)
    return [TensorType(x.dtype, tuple(shape))]


def _upsample_attrs(node):
    out = {"linear": _upsample_mode(node)}
    if node.version < 9:
        out["scales"] = tuple(float(s) for s in required(node, "scales"))
    return out


def _zero(node, inputs, outputs):
    return 0


OPS = (
    OpDef(
        "Tile",
        (6, 13),
        infer=_infer_tile,
        fn=k_tile,
        flops=_zero,
        CONST_INPUTS=(1,),
        torch=_torch.tile,
        scratch=no_scratch,
        cost_kind="gather",
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
    OpDef(
        "TopK",
        (1, 10, 11),
        infer=_infer_topk,
        fn=k_topk,
        flops=lambda node, inputs, outputs: 2 * inputs[0].numel(),
        attrs=_topk_kernel_attrs,
        ATTRS={"axis": INT, "k": INT, "largest": INT, "sorted": INT},
        CONST_INPUTS=(1,),
    ),
    OpDef(
        "Hardmax",
        (1, 11, 13),
        infer=_infer_hardmax,
        fn=k_hardmax,
        flops=per_element(2),
        attrs=_hardmax_attrs,
        ATTRS={"axis": INT},
    ),
    OpDef(
        "Upsample",
        (7, 9),
        infer=_infer_upsample,
        fn=k_upsample,
        flops=per_element(4),
        attrs=_upsample_attrs,
        ATTRS={"mode": STR, "scales": FLOAT_LIST},
        CONST_INPUTS=(1,),
        scratch=upsample_scratch,
    ),
)
