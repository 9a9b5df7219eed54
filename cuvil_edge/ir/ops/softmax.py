"""Softmax, LogSoftmax and Hardmax (1 at the first maximum, 0 elsewhere), one table row each (the
op contract: ``_contract.py``). Before opset 13 they normalise the 2-D flattening at ``axis``
(default 1); from 13 along ``axis`` alone (default -1). The ``legacy`` keyword (Hardmax's
``flatten``) says which; a call site specialised for it keeps one of the two."""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir import dtypes
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, Probe, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, want
from cuvil_edge.ir.ops._native import _native_lib
from cuvil_edge.ir.ops._scratch import log_softmax_scratch, softmax_scratch
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES, INT, axis_index, need, want_dtype

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]


def k_softmax(x, *, axis, legacy):
    if x.size == 0:  # fallback: an empty input (a batch of none) has no rows to normalise
        return x.copy()
    if TARGET_NATIVE:
        first = axis + x.ndim if axis < 0 else axis
        lib = _native_lib() if x.dtype == np.float32 and (legacy or first == x.ndim - 1) else None
        if lib is not None:
            # rows of the normalised (trailing) dims, one pass each in C
            xc = np.ascontiguousarray(x)
            y = np.empty_like(xc)
            size = 1
            for dim in x.shape[first:]:
                size *= dim
            lib.cuvil_softmax_f32(xc.ctypes.data, y.ctypes.data, x.size // size, size)
            return y
    # legacy: rows = the dims before axis (a negative axis counts from the end in both slicings)
    v = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1) if legacy else x
    on = 1 if legacy else axis
    e = np.exp(v - v.max(axis=on, keepdims=True))
    e /= e.sum(axis=on, keepdims=True)  # e is this call's own array
    return e.reshape(x.shape)


def k_log_softmax(x, *, axis, legacy):
    if x.size == 0:  # fallback: an empty input (a batch of none) has no rows to normalise
        return x.copy()
    v = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1) if legacy else x
    on = 1 if legacy else axis
    shifted = v - v.max(axis=on, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=on, keepdims=True))).reshape(x.shape)


def k_hardmax(x, axis, flatten):
    w = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1) if flatten else x
    a = 1 if flatten else axis + x.ndim if axis < 0 else axis
    first = np.expand_dims(np.argmax(w, axis=a), a)
    out = (np.arange(w.shape[a]).reshape([-1 if i == a else 1 for i in range(w.ndim)]) == first).astype(x.dtype)
    return out.reshape(x.shape)


def _attrs(node):
    return {"axis": int(node.attr("axis", -1 if node.version >= 13 else 1)), "legacy": int(node.version < 13)}


def _infer(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    axis_index(node, _attrs(node)["axis"], inputs[0].rank)
    return [inputs[0]]


def _flops(node, inputs, outputs):
    return 4 * outputs[0].numel()  # subtract max, exp, sum, divide (LogSoftmax: subtract the log)


def _hardmax_attrs(node):
    return {"axis": int(node.attr("axis", 1 if node.version < 13 else -1)), "flatten": node.version < 13}


def _infer_hardmax(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((1, FLOATS),))
    a = _hardmax_attrs(node)
    axis_index(node, a["axis"], x.rank, extra=1 if a["flatten"] else 0)
    return [x]


OPS = (
    OpDef(
        "Softmax",
        (1, 11, 13),
        batch="softmax",
        infer=_infer,
        fn=k_softmax,
        flops=_flops,
        attrs=_attrs,
        helpers=(_native_lib,),
        ATTRS={"axis": INT},
        torch=_torch.softmax,
        scratch=softmax_scratch,
        transcendental=True,
        cost_native="softmax",
        probes=(Probe((1, 16, 64), {"axis": -1}),),
    ),
    OpDef(
        "LogSoftmax",
        (1, 11, 13),
        batch="softmax",
        infer=_infer,
        fn=k_log_softmax,
        flops=_flops,
        attrs=_attrs,
        ATTRS={"axis": INT},
        torch=_torch.softmax,
        scratch=log_softmax_scratch,
        transcendental=True,
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
)
