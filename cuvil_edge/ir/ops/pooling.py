"""Pooling, one table row each (the op contract: ``_contract.py``): MaxPool (with its optional
Indices output), AveragePool, GlobalAveragePool and GlobalMaxPool.

They share the window helpers and attribute resolution of ``_window.py`` (``SAME_*`` pads in a
branch that call sites with explicit pads lose when specialised). Float32 2-D max pooling runs the
native kernel where the target has it, at every plane size (on 8x8 planes too it costs a third of
numpy's four strided maxima, which allocate a padded copy and a buffer per tap).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, Probe, no_scratch
from cuvil_edge.ir.ops._native import _native_lib
from cuvil_edge.ir.ops._scratch import average_pool_scratch, max_pool_scratch
from cuvil_edge.ir.ops._util import (
    DEFAULT_CAPABILITIES,
    INT,
    WINDOW_ATTRS,
    ints,
    need,
    pool_out,
    spatial_attrs,
    want_dtype,
)
from cuvil_edge.ir.ops._window import _WINDOW, _win_out, _win_same_pads, _win_taps, _window_attrs

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]


# --- kernels ----------------------------------------------------------------------------------
def k_max_pool(x, *, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, indices, storage_order):
    """Y, and with ``indices`` also the flat index into X of each window's first maximum (pads
    excluded; row-major over the spatial dims, column-major with storage_order=1)."""
    spatial = x.shape[2:]
    if auto_pad == "NOTSET":
        pd = pads
    else:
        pd = _win_same_pads(spatial, kernel_shape, strides, dilations, auto_pad == "SAME_UPPER")
    out = _win_out(spatial, kernel_shape, strides, pd, dilations, ceil_mode)
    if TARGET_NATIVE and not indices:
        lib = _native_lib() if len(out) == 2 and x.dtype == np.float32 else None
        if lib is not None:
            xc = np.ascontiguousarray(x)
            y = np.empty(x.shape[:2] + out, dtype=np.float32)
            if (
                lib.cuvil_max_pool2d_f32(
                    xc.ctypes.data,
                    y.ctypes.data,
                    x.shape[0] * x.shape[1],
                    x.shape[2],
                    x.shape[3],
                    kernel_shape[0],
                    kernel_shape[1],
                    strides[0],
                    strides[1],
                    dilations[0],
                    dilations[1],
                    pd[0],
                    pd[1],
                    out[0],
                    out[1],
                    (out[0] - 1) * strides[0] + dilations[0] * (kernel_shape[0] - 1) + 1,
                    (out[1] - 1) * strides[1] + dilations[1] * (kernel_shape[1] - 1) + 1,
                )
                != 0
            ):  # fallback: the library reports a failed allocation of its padded plane as a typed error
                raise MemoryError("the native max pooling could not allocate its padded plane")
            return y
    if not indices:
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        y = None
        for _, v in _win_taps(x, kernel_shape, strides, pd, dilations, out, fill):
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        return y
    n = len(kernel_shape)
    if storage_order:
        steps = [int(np.prod(spatial[:i], dtype=np.int64)) for i in range(n)]
    else:
        steps = [int(np.prod(spatial[i + 1 :], dtype=np.int64)) for i in range(n)]
    base = np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * int(np.prod(spatial, dtype=np.int64))
    base = base.reshape(x.shape[:2] + (1,) * n)
    y = np.zeros(x.shape[:2] + out, dtype=x.dtype)
    index = np.full(y.shape, -1, dtype=np.int64)
    for tap in np.ndindex(*kernel_shape):
        valid = np.ones(out, dtype=bool)
        flat = np.zeros(out, dtype=np.int64)
        where = []
        for i in range(n):
            pos = np.arange(out[i], dtype=np.int64) * strides[i] - pd[i] + tap[i] * dilations[i]
            shape = [1] * n
            shape[i] = out[i]
            valid = valid & ((pos >= 0) & (pos < spatial[i])).reshape(shape)
            flat = flat + (np.clip(pos, 0, spatial[i] - 1) * steps[i]).reshape(shape)
            where.append(np.clip(pos, 0, spatial[i] - 1).reshape(shape))
        v = x[(slice(None), slice(None)) + tuple(np.broadcast_arrays(*where))] if n else x
        take = valid & ((index < 0) | (v > y))
        y = np.where(take, v, y)
        index = np.where(take, base + flat, index)
    return y, index


def k_average_pool(x, *, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode, count_include_pad):
    """Mean over windows; ``count_include_pad`` counts explicit pads, never the cells ceil_mode adds."""
    n = len(kernel_shape)
    if auto_pad == "NOTSET":
        pd = pads
    else:
        pd = _win_same_pads(x.shape[2:], kernel_shape, strides, dilations, auto_pad == "SAME_UPPER")
    out = _win_out(x.shape[2:], kernel_shape, strides, pd, dilations, ceil_mode)
    total = np.zeros(x.shape[:2] + out, dtype=x.dtype)
    for _, v in _win_taps(x, kernel_shape, strides, pd, dilations, out, 0):
        total += v
    inside = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    count = np.zeros((1, 1) + out, dtype=x.dtype)
    if count_include_pad:
        inside = np.pad(inside, [(0, 0), (0, 0)] + [(pd[i], pd[i + n]) for i in range(n)], constant_values=1)
        for _, v in _win_taps(inside, kernel_shape, strides, (0,) * (2 * n), dilations, out, 0):
            count += v
    else:
        for _, v in _win_taps(inside, kernel_shape, strides, pd, dilations, out, 0):
            count += v
    return total / count


def k_global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)


def k_global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


# --- attributes -------------------------------------------------------------------------------
def _pool_attrs(node) -> dict:
    kernel = tuple(ints(node, "kernel_shape"))
    return {"kernel_shape": kernel, **_window_attrs(node, len(kernel)), "ceil_mode": int(node.attr("ceil_mode", 0))}


def _max_pool_attrs(node) -> dict:
    return {
        **_pool_attrs(node),
        "indices": int(_wants_indices(node)),
        "storage_order": int(node.attr("storage_order", 0)),
    }


def _average_pool_attrs(node) -> dict:
    return {**_pool_attrs(node), "count_include_pad": int(node.attr("count_include_pad", 0))}


def _wants_indices(node) -> bool:
    return len(node.outputs) > 1 and bool(node.outputs[1])


# --- inference --------------------------------------------------------------------------------
def pool_type(node, x: TensorType) -> TensorType:
    """Output type of a MaxPool/AveragePool node on input ``x``."""
    kernel = ints(node, "kernel_shape")
    if not kernel or x.rank != len(kernel) + 2:
        raise ShapeInferenceError(f"{node.describe()} needs kernel_shape with one entry per spatial dim of {x}")
    strides, pads, dilations = spatial_attrs(node, x.shape[2:], kernel)
    n, ceil_mode = len(kernel), int(node.attr("ceil_mode", 0))
    out = [
        pool_out(node, x.shape[2 + i], kernel[i], strides[i], pads[i], pads[i + n], dilations[i], ceil_mode)
        for i in range(n)
    ]
    return TensorType(x.dtype, (*x.shape[:2], *out))


def _infer_max_pool(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int8", "uint8"})
    y = pool_type(node, inputs[0])
    if not _wants_indices(node):
        return [y]
    if node.version < 8:
        raise UnsupportedAttributeError(
            f"{node.describe()} asks for the Indices output, which MaxPool has from opset 8"
        )
    if int(node.attr("storage_order", 0)) not in (0, 1):
        raise UnsupportedAttributeError(
            f"{node.describe()}: storage_order={node.attr('storage_order')} (supported: 0, 1)"
        )
    return [y, TensorType("int64", y.shape)]


def _infer_average_pool(node, inputs):
    need(node, inputs, 1)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    return [pool_type(node, inputs[0])]


def _infer_global(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want_dtype(node, x, dtypes.FLOATS)
    if x.rank < 3:
        raise ShapeInferenceError(f"{node.describe()} needs (N, C, *spatial), got {x}")
    return [TensorType(x.dtype, (*x.shape[:2], *([1] * (x.rank - 2))))]


# --- cost -------------------------------------------------------------------------------------


# --- costs ------------------------------------------------------------------------------------
def _taps(node) -> int:
    taps = 1
    for k in ints(node, "kernel_shape"):
        taps *= k
    return taps


def _max_pool_flops(node, inputs, outputs):
    return outputs[0].numel() * _taps(node)


def _average_pool_flops(node, inputs, outputs):
    return outputs[0].numel() * (_taps(node) + 1)


def _global_average_flops(node, inputs, outputs):
    return inputs[0].numel() + outputs[0].numel()


def _global_max_flops(node, inputs, outputs):
    return inputs[0].numel()


_POOL_ATTRS = {**WINDOW_ATTRS, "ceil_mode": INT}

OPS = (
    OpDef(
        "MaxPool",
        (1, 8, 10, 11, 12),
        batch=BatchRule("windowed", sample_axes=(0, 1), indices=1),
        infer=_infer_max_pool,
        fn=k_max_pool,
        flops=_max_pool_flops,
        attrs=_max_pool_attrs,
        helpers=_WINDOW + (_native_lib,),
        ATTRS={**_POOL_ATTRS, "storage_order": INT},
        torch=_torch.pool,
        torch_check=_torch.check_max_pool,
        scratch=max_pool_scratch,
        cost_kind="window taps",
        cost_native="max pool",
        probes=(Probe((1, 16, 8, 8), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, kinds=("numpy window taps",)),),
    ),
    OpDef(
        "AveragePool",
        (1, 7, 10, 11, 19),
        batch=BatchRule("windowed", sample_axes=(0, 1)),
        infer=_infer_average_pool,
        fn=k_average_pool,
        flops=_average_pool_flops,
        attrs=_average_pool_attrs,
        helpers=_WINDOW,
        ATTRS={**_POOL_ATTRS, "count_include_pad": INT},
        torch=_torch.pool,
        torch_check=_torch.check_average_pool,
        scratch=average_pool_scratch,
        cost_kind="window taps counted",
    ),
    OpDef(
        "GlobalAveragePool",
        (1, 22),
        batch=BatchRule("windowed", sample_axes=(0, 1)),
        infer=_infer_global,
        fn=k_global_average_pool,
        flops=_global_average_flops,
        torch=_torch.global_average_pool,
        scratch=no_scratch,
        cost_kind="reduce",
    ),
    OpDef(
        "GlobalMaxPool",
        (1, 22),
        batch=BatchRule("windowed", sample_axes=(0, 1)),
        infer=_infer_global,
        fn=k_global_max_pool,
        flops=_global_max_flops,
        torch=_torch.global_max_pool,
        scratch=no_scratch,
        cost_kind="reduce",
    ),
)
