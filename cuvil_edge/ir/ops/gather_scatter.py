"""Index-driven reads and writes, one table row each (the op contract: ``_contract.py``):
Gather, GatherElements, GatherND, ScatterElements, ScatterND, OneHot. Negative indices count from
the end, as ONNX allows; scatter reductions (none, add, mul, max, min) apply duplicates in index
order. Gather also reads symbolic shape vectors (``dtype=object`` arrays, see ``_shape.py``).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, Probe, per_element
from cuvil_edge.ir.ops._scratch import gather_scratch
from cuvil_edge.ir.ops._util import INT, STR, axis_index, choice, need

_INDEX = frozenset({"int32", "int64"})


def k_gather(data, indices, axis):
    size = data.shape[axis]
    where = np.asarray(indices).astype(np.int64)
    if where.size and (where.min() < -size or where.max() >= size):
        raise IndexError(f"Gather index out of range for axis {axis} of size {size}")
    y = np.take(data, np.where(where < 0, where + size, where), axis=axis)
    return y if isinstance(y, np.ndarray) else np.array(y, dtype=data.dtype)  # object data gives a bare element


def k_gather_elements(data, indices, axis):
    idx = np.where(indices < 0, indices + data.shape[axis], indices).astype(np.int64)
    return np.take_along_axis(data, idx, axis=axis)


def k_gather_nd(data, indices, batch_dims):
    depth = indices.shape[-1]
    sizes = np.array(data.shape[batch_dims : batch_dims + depth], dtype=np.int64)
    idx = np.where(indices < 0, indices + sizes, indices).astype(np.int64)
    flat_data = data.reshape((-1,) + data.shape[batch_dims:])
    flat_idx = idx.reshape((-1,) + idx.shape[batch_dims:])
    parts = [d[tuple(np.moveaxis(i, -1, 0))] for d, i in zip(flat_data, flat_idx, strict=True)]
    tail = data.shape[batch_dims + depth :]
    return (
        np.stack(parts).reshape(indices.shape[:-1] + tail) if parts else np.zeros(indices.shape[:-1] + tail, data.dtype)
    )


def _scatter_into(out, where, updates, reduction):
    if reduction == "none":
        out[where] = updates
    elif reduction == "add":
        np.add.at(out, where, updates)
    elif reduction == "mul":
        np.multiply.at(out, where, updates)
    elif reduction == "max":
        np.maximum.at(out, where, updates)
    else:
        np.minimum.at(out, where, updates)
    return out


def k_scatter_elements(data, indices, updates, axis, reduction):
    idx = np.where(indices < 0, indices + data.shape[axis], indices).astype(np.int64)
    grid = np.indices(idx.shape, sparse=True)
    where = tuple(idx if d == axis else grid[d] for d in range(data.ndim))
    return _scatter_into(data.copy(), where, updates, reduction)


def k_scatter_nd(data, indices, updates, reduction):
    sizes = np.array(data.shape[: indices.shape[-1]], dtype=np.int64)
    idx = np.where(indices < 0, indices + sizes, indices).astype(np.int64)
    return _scatter_into(data.copy(), tuple(np.moveaxis(idx, -1, 0)), updates, reduction)


def k_one_hot(indices, depth, values, axis):
    d = int(np.asarray(depth).reshape(-1)[0])
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    ax = axis + indices.ndim + 1 if axis < 0 else axis
    hot = np.expand_dims(idx, ax) == np.arange(d).reshape([d if i == ax else 1 for i in range(indices.ndim + 1)])
    return np.where(hot, values[1], values[0]).astype(values.dtype)


# --- inference and attributes -------------------------------------------------------------------
def _reduction(node):
    allowed = (
        ("none",)
        if node.version < 16
        else ("none", "add", "mul")
        if node.version < 18
        else ("none", "add", "mul", "max", "min")
    )
    return choice(node, "reduction", "none", allowed)


def _index_type(node, t, what="indices"):
    if t.dtype not in _INDEX:
        raise ShapeInferenceError(f"{node.describe()}: {what} must be int32 or int64, got {t}")


def _infer_gather(node, inputs):
    """data.shape[:axis] + indices.shape + data.shape[axis+1:]; negative indices count from the end."""
    need(node, inputs, 2)
    data, indices = inputs
    if indices.dtype not in ("int32", "int64"):
        raise ShapeInferenceError(f"{node.describe()}: indices must be int32 or int64, got {indices.dtype}")
    if data.rank == 0:
        raise ShapeInferenceError(f"{node.describe()}: data must have rank >= 1")
    axis = axis_index(node, int(node.attr("axis", 0)), data.rank)
    return [TensorType(data.dtype, data.shape[:axis] + indices.shape + data.shape[axis + 1 :])]


def _infer_gather_elements(node, inputs):
    need(node, inputs, 2)
    data, indices = inputs
    _index_type(node, indices)
    if data.rank != indices.rank or data.rank == 0:
        raise ShapeInferenceError(f"{node.describe()}: data {data} and indices {indices} need the same rank >= 1")
    axis_index(node, int(node.attr("axis", 0)), data.rank)
    return [TensorType(data.dtype, indices.shape)]


def _infer_gather_nd(node, inputs):
    need(node, inputs, 2)
    data, indices = inputs
    _index_type(node, indices)
    b = int(node.attr("batch_dims", 0))
    depth = indices.shape[-1] if indices.rank else None
    if (
        not isinstance(depth, int)
        or indices.rank < 1
        or b < 0
        or b >= min(data.rank, indices.rank)
        or depth > data.rank - b
    ):
        raise ShapeInferenceError(f"{node.describe()}: data {data}, indices {indices}, batch_dims {b} do not fit")
    return [TensorType(data.dtype, tuple(indices.shape[:-1]) + tuple(data.shape[b + depth :]))]


def _infer_scatter_elements(node, inputs):
    need(node, inputs, 3)
    data, indices, updates = inputs
    _index_type(node, indices)
    if updates.dtype != data.dtype or updates.shape != indices.shape or data.rank != indices.rank:
        raise ShapeInferenceError(f"{node.describe()}: updates {updates} must match indices {indices} and data {data}")
    axis_index(node, int(node.attr("axis", 0)), data.rank)
    _reduction(node)
    return [data]


def _infer_scatter_nd(node, inputs):
    need(node, inputs, 3)
    data, indices, updates = inputs
    _index_type(node, indices, "indices")
    depth = indices.shape[-1] if indices.rank else None
    if not isinstance(depth, int) or depth > data.rank or updates.dtype != data.dtype:
        raise ShapeInferenceError(f"{node.describe()}: data {data}, indices {indices}, updates {updates} do not fit")
    _reduction(node)
    return [data]


def _infer_one_hot(node, inputs, consts=None):
    need(node, inputs, 3)
    indices, depth, values = inputs
    value = (consts or {}).get(1)
    if value is None or np.asarray(value).size != 1 or np.asarray(value).dtype.kind not in "iuf":
        raise ShapeInferenceError(f"{node.describe()}: depth must be a constant scalar; it decides the output shape")
    d = int(np.asarray(value).reshape(-1)[0])
    if d < 1 or values.rank != 1 or values.shape[0] not in (2, None):
        raise ShapeInferenceError(f"{node.describe()}: depth {d} and values {values} (off, on) are invalid")
    ax = axis_index(node, int(node.attr("axis", -1)), indices.rank + 1)
    shape = list(indices.shape)
    shape.insert(ax, d)
    return [TensorType(values.dtype, tuple(shape))]


def _zero(node, inputs, outputs):
    return 0


OPS = (
    OpDef(
        "Gather",
        (1, 11, 13),
        batch=BatchRule("gather", data=(0, 1)),
        infer=_infer_gather,
        fn=k_gather,
        flops=_zero,
        attrs=lambda node: {"axis": int(node.attr("axis", 0))},
        ATTRS={"axis": INT},
        torch=_torch.gather,
        scratch=gather_scratch,
        cost_kind="gather",
        probes=(Probe((16, 64), {"axis": 0}, lambda: (np.arange(16, dtype=np.int64),)),),
    ),
    OpDef(
        "GatherElements",
        (11, 13),
        infer=_infer_gather_elements,
        fn=k_gather_elements,
        flops=_zero,
        attrs=lambda node: {"axis": int(node.attr("axis", 0))},
        ATTRS={"axis": INT},
        cost_kind="gather",
    ),
    OpDef(
        "GatherND",
        (11, 12, 13),
        infer=_infer_gather_nd,
        fn=k_gather_nd,
        flops=_zero,
        attrs=lambda node: {"batch_dims": int(node.attr("batch_dims", 0))},
        ATTRS={"batch_dims": INT},
        cost_kind="gather",
    ),
    OpDef(
        "ScatterElements",
        (11, 13, 16, 18),
        infer=_infer_scatter_elements,
        fn=k_scatter_elements,
        flops=per_element(1),
        attrs=lambda node: {"axis": int(node.attr("axis", 0)), "reduction": _reduction(node)},
        helpers=(_scatter_into,),
        ATTRS={"axis": INT, "reduction": STR},
    ),
    OpDef(
        "ScatterND",
        (11, 13, 16, 18),
        infer=_infer_scatter_nd,
        fn=k_scatter_nd,
        flops=per_element(1),
        attrs=lambda node: {"reduction": _reduction(node)},
        helpers=(_scatter_into,),
        ATTRS={"reduction": STR},
        cost_kind="gather",
    ),
    OpDef(
        "OneHot",
        (9, 11),
        infer=_infer_one_hot,
        fn=k_one_hot,
        flops=per_element(1),
        attrs=lambda node: {"axis": int(node.attr("axis", -1))},
        ATTRS={"axis": INT},
        CONST_INPUTS=(1,),
    ),
)
