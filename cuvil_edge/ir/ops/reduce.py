"""Reductions, one table row each (the op contract: ``_contract.py``): ReduceMax, ReduceMean,
ReduceSum, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum,
ReduceLogSumExp over ``axes``; ArgMax and ArgMin (the index of the extreme along one ``axis``,
which ONNX files under reduction); and the scans CumSum and CumProd.

``axes`` is an attribute before opset 18 (ReduceSum: 13) and input 1 from then on; an empty or
absent axes reduces every axis unless noop_with_empty_axes=1 (shared rules: ``_reduce.py``).
Reducing an empty set gives the reduction's identity, as ONNX defines it (-inf / the dtype's
minimum / False for ReduceMax, +inf / the dtype's maximum / True for ReduceMin, 1 for ReduceProd,
0 for the sums, -inf for the logarithms). ReduceMean of integers is the mean truncated to the
input dtype.

CumSum and CumProd are scans, not reductions: the running sum or product along the ``axis`` of
input 1, which keeps that axis's length (``exclusive`` shifts it by one, ``reverse`` runs from the
end). ONNX files them under math; they sit here because they walk one axis as ArgMax does.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _reduce, _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, no_scratch, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, NUMERIC, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._reduce import _reduce_axes
from cuvil_edge.ir.ops._scratch import reduce_mean_scratch
from cuvil_edge.ir.ops._util import INT, axis_index, need

#: The opset from which ``axes`` is input 1 (ReduceSum's changed at 13).
_SINCE = 18


def k_reduce_max(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return x.copy()
    if x.size == 0:
        low = -np.inf if x.dtype.kind == "f" else False if x.dtype.kind == "b" else np.iinfo(x.dtype).min
        return np.asarray(np.max(x, axis=dims, keepdims=keepdims, initial=low)).astype(x.dtype)
    return np.asarray(x.max(axis=dims, keepdims=keepdims))


def k_reduce_mean(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return x.copy()
    y = x.mean(axis=dims, keepdims=keepdims, dtype=np.float64 if x.dtype.kind != "f" else None)
    return np.asarray(y).astype(x.dtype)


def k_reduce_sum(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return x.copy()
    return np.asarray(x.sum(axis=dims, keepdims=keepdims, dtype=x.dtype))


def k_reduce_min(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return x.copy()
    high = np.inf if x.dtype.kind == "f" else True if x.dtype.kind == "b" else np.iinfo(x.dtype).max
    return np.asarray(np.min(x, axis=dims, keepdims=keepdims, initial=high)).astype(x.dtype)


def k_reduce_prod(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return x.copy()
    return np.asarray(np.prod(x, axis=dims, keepdims=keepdims, dtype=x.dtype))


def k_reduce_l1(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return np.abs(x)
    return np.asarray(np.sum(np.abs(x), axis=dims, keepdims=keepdims, dtype=x.dtype))


def k_reduce_l2(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    if dims is None:
        return np.abs(x)
    return np.asarray(np.sqrt(np.sum(np.square(w), axis=dims, keepdims=keepdims))).astype(x.dtype)


def k_reduce_sum_square(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return np.square(x)
    return np.asarray(np.sum(np.square(x), axis=dims, keepdims=keepdims, dtype=x.dtype))


def k_reduce_log_sum(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    with np.errstate(divide="ignore", invalid="ignore"):
        if dims is None:
            return np.log(x)
        return np.asarray(np.log(np.sum(x, axis=dims, keepdims=keepdims, dtype=x.dtype)))


def k_reduce_log_sum_exp(x, axes=None, keepdims=True, noop=0):
    dims = _reduce_axes(x, axes, noop)
    if dims is None:
        return x.copy()
    if x.size == 0:
        return np.asarray(np.sum(x, axis=dims, keepdims=keepdims) - np.inf).astype(x.dtype)
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    top = np.max(np.where(np.isinf(w), -np.inf, w), axis=dims, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)  # all -inf (or inf) along an axis: no shift
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        out = np.log(np.sum(np.exp(w - top), axis=dims, keepdims=True)) + top
    if not keepdims:
        out = np.squeeze(out, axis=dims)
    return np.asarray(out).astype(x.dtype)


# --- ArgMax, ArgMin: the index of the extreme along one axis ------------------------------------
def k_argmax(x, axis, keepdims, last):
    index = x.shape[axis] - 1 - np.argmax(np.flip(x, axis), axis=axis) if last else np.argmax(x, axis=axis)
    return (np.expand_dims(index, axis) if keepdims else np.asarray(index)).astype(np.int64)


def k_argmin(x, axis, keepdims, last):
    index = x.shape[axis] - 1 - np.argmin(np.flip(x, axis), axis=axis) if last else np.argmin(x, axis=axis)
    return (np.expand_dims(index, axis) if keepdims else np.asarray(index)).astype(np.int64)


# --- CumSum, CumProd: scans, the running sum or product along one axis --------------------------
def k_cumsum(x, axis, exclusive, reverse):
    a = int(np.asarray(axis).reshape(-1)[0])
    a = a + x.ndim if a < 0 else a
    w = np.flip(x, a) if reverse else x
    out = np.cumsum(w, axis=a, dtype=x.dtype)
    if exclusive:  # each position sums the ones before it
        shifted = np.zeros_like(out)
        to, frm = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        to[a], frm[a] = slice(1, None), slice(None, -1)
        shifted[tuple(to)] = out[tuple(frm)]
        out = shifted
    return np.flip(out, a).copy() if reverse else out


def k_cum_prod(x, axis, exclusive, reverse):
    a = int(np.asarray(axis).reshape(())) % x.ndim
    w = np.flip(x, a) if reverse else x
    if exclusive:  # shift right by one along the axis, 1 first
        ones = np.ones(w.shape[:a] + (1,) + w.shape[a + 1 :], dtype=x.dtype)
        w = np.concatenate((ones, np.take(w, np.arange(w.shape[a] - 1), axis=a)), axis=a)
    out = np.cumprod(w, axis=a, dtype=x.dtype)
    return np.flip(out, a) if reverse else out


def _row(op_type, fn, versions, allowed, cost=1, since=_SINCE, **facets) -> OpDef:
    def infer(node, inputs, consts=None):
        return _reduce.infer(node, inputs, consts, since, allowed=allowed)

    def flops(node, inputs, outputs):
        return cost * inputs[0].numel()

    return OpDef(
        op_type,
        versions,
        infer=infer,
        fn=fn,
        flops=flops,
        attrs=lambda node: _reduce.attrs(node, since),
        helpers=(_reduce_axes,),
        ATTRS=_reduce.ATTRS,
        CONST_INPUTS=(1,),
        torch=_torch.reduction(since),
        **facets,
    )


def _arg_attrs(node):
    return {
        "axis": int(node.attr("axis", 0)),
        "keepdims": int(node.attr("keepdims", 1)),
        "last": int(node.attr("select_last_index", 0)) if node.version >= 12 else 0,
    }


def _infer_arg(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((1, NUMERIC),))
    if x.rank == 0:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 1")
    a = {**_arg_attrs(node), "axis": axis_index(node, int(node.attr("axis", 0)), x.rank)}
    if x.shape[a["axis"]] == 0:
        raise ShapeInferenceError(f"{node.describe()}: axis {a['axis']} of {x} is empty")
    shape = (
        [1 if i == a["axis"] else d for i, d in enumerate(x.shape)]
        if a["keepdims"]
        else [d for i, d in enumerate(x.shape) if i != a["axis"]]
    )
    return [TensorType("int64", tuple(shape))]


def _arg_row(op_type, fn):
    # the axis may stay negative: numpy's argmax, flip and expand_dims count it from the end
    return OpDef(
        op_type,
        (1, 11, 12, 13),
        infer=_infer_arg,
        fn=fn,
        flops=per_element(1),
        attrs=_arg_attrs,
        ATTRS={"axis": INT, "keepdims": INT, "select_last_index": INT},
        cost_kind="reduce",  # numpy's reduction loop, as ReduceMax
    )


#: CumProd's dtypes (opset 26): the floats and the 32- and 64-bit integers.
CUMPROD = FLOATS | {"int32", "int64", "uint32", "uint64"}


def _infer_cumsum(node, inputs):
    need(node, inputs, 2)
    x, axis = inputs
    want(node, x, ((11, NUMERIC),))
    if axis.dtype not in ("int32", "int64") or axis.rank > 1:
        raise ShapeInferenceError(f"{node.describe()}: axis must be an int32/int64 scalar, got {axis}")
    return [x]


def _infer_cum_prod(node, inputs):
    need(node, inputs, 2)
    x, axis = inputs
    want(node, x, ((26, CUMPROD),))
    if axis.dtype not in ("int32", "int64") or axis.rank > 1:
        raise ShapeInferenceError(f"{node.describe()}: axis must be an int32/int64 scalar, got {axis}")
    if x.rank < 1:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 1, got {x}")
    return [x]


_NUMBERS = _reduce.NUMBERS
#: batch independence: the axes (input 1 from opset 18) are checked to leave out the batch axis
_BATCH = BatchRule("reduce", since=_SINCE, shape=(1,))
OPS = (
    _row(
        "ReduceMax",
        k_reduce_max,
        (1, 11, 12, 13, 18, 20),
        _NUMBERS | {"bool"},
        scratch=no_scratch,
        cost_kind="reduce",
        batch=_BATCH,
    ),  # 20: bool
    _row(
        "ReduceMean",
        k_reduce_mean,
        (1, 11, 13, 18),
        _NUMBERS,
        scratch=reduce_mean_scratch,
        cost_kind="reduce",
        batch=_BATCH,
    ),
    _row(
        "ReduceSum",
        k_reduce_sum,
        (1, 11, 13),
        _NUMBERS,
        since=13,
        scratch=no_scratch,
        cost_kind="reduce",
        batch=BatchRule("reduce", since=13, shape=(1,)),
    ),
    _row("ReduceMin", k_reduce_min, (1, 11, 12, 13, 18, 20), _NUMBERS | {"bool"}, cost_kind="reduce"),
    _row("ReduceProd", k_reduce_prod, (1, 11, 13, 18), _NUMBERS, cost_kind="reduce"),
    _row("ReduceL1", k_reduce_l1, (1, 11, 13, 18), _NUMBERS, 2),
    _row("ReduceL2", k_reduce_l2, (1, 11, 13, 18), _NUMBERS, 2, cost_kind="reduce"),
    _row("ReduceSumSquare", k_reduce_sum_square, (1, 11, 13, 18), _NUMBERS, 2, cost_kind="reduce"),
    _row("ReduceLogSum", k_reduce_log_sum, (1, 11, 13, 18, 28), dtypes.FLOATS, 1),
    _row("ReduceLogSumExp", k_reduce_log_sum_exp, (1, 11, 13, 18, 28), dtypes.FLOATS, TRANSCENDENTAL + 3),
    _arg_row("ArgMax", k_argmax),
    _arg_row("ArgMin", k_argmin),
    OpDef(
        "CumSum",
        (11, 14),
        infer=_infer_cumsum,
        fn=k_cumsum,
        flops=per_element(1),
        attrs=lambda node: {"exclusive": int(node.attr("exclusive", 0)), "reverse": int(node.attr("reverse", 0))},
        ATTRS={"exclusive": INT, "reverse": INT},
    ),
    OpDef(
        "CumProd",
        (26,),
        infer=_infer_cum_prod,
        fn=k_cum_prod,
        flops=per_element(1),
        attrs=lambda node: {"exclusive": int(node.attr("exclusive", 0)), "reverse": int(node.attr("reverse", 0))},
        ATTRS={"exclusive": INT, "reverse": INT},
    ),
)
