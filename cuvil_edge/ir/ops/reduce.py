"""Reductions over ``axes``, one table row each (the op contract: ``_contract.py``): ReduceMax,
ReduceMean, ReduceSum, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum,
ReduceLogSumExp.

``axes`` is an attribute before opset 18 (ReduceSum: 13) and input 1 from then on; an empty or
absent axes reduces every axis unless noop_with_empty_axes=1 (shared rules: ``_reduce.py``).
Reducing an empty set gives the reduction's identity, as ONNX defines it (-inf / the dtype's
minimum / False for ReduceMax, +inf / the dtype's maximum / True for ReduceMin, 1 for ReduceProd,
0 for the sums, -inf for the logarithms). ReduceMean of integers is the mean truncated to the
input dtype.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir import dtypes
from cuvil_edge.ir.ops import _reduce, _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, no_scratch
from cuvil_edge.ir.ops._elementwise import TRANSCENDENTAL
from cuvil_edge.ir.ops._reduce import _reduce_axes
from cuvil_edge.ir.ops._scratch import reduce_mean_scratch

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
)
