"""Writes into a tensor at given positions, one table row each (the op contract:
``_contract.py``): TensorScatter (opset 24: write a KV-cache update at each batch row's write
index, linear or circular) and Scatter (opsets 9-10, ScatterElements' old name, no reduction).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import ALL, want
from cuvil_edge.ir.ops._util import INT, STR, axis_index, choice, need


def k_tensor_scatter(past_cache, update, write_indices=None, *, axis, circular):
    a = axis % past_cache.ndim
    length, steps = past_cache.shape[a], update.shape[a]
    starts = np.zeros(past_cache.shape[0], np.int64) if write_indices is None else write_indices.astype(np.int64)
    rows = starts.reshape(-1, 1) + np.arange(steps)  # (batch, steps): where each update step lands
    if circular:
        rows = rows % length
    shape = [1] * past_cache.ndim
    shape[0], shape[a] = past_cache.shape[0], steps
    index = np.broadcast_to(rows.reshape(shape), update.shape)
    out = past_cache.copy()
    np.put_along_axis(out, index, update, axis=a)
    return out


def k_scatter(data, indices, updates, axis):
    idx = np.where(indices < 0, indices + data.shape[axis], indices).astype(np.int64)
    out = data.copy()
    np.put_along_axis(out, idx, updates, axis=axis)
    return out


def _infer_tensor_scatter(node, inputs):
    need(node, inputs, 2, 1)
    cache, update = inputs[:2]
    want(node, cache, ((24, ALL),))
    if update.dtype != cache.dtype or update.rank != cache.rank or cache.rank < 2:
        raise ShapeInferenceError(f"{node.describe()}: update {update} must match past_cache {cache} in dtype and rank")
    a = axis_index(node, int(node.attr("axis", -2)), cache.rank)
    if a == 0:
        raise ShapeInferenceError(f"{node.describe()}: axis 0 is the batch axis; the sequence axis must come later")
    for i, (c, u) in enumerate(zip(cache.shape, update.shape, strict=True)):
        if isinstance(c, int) and isinstance(u, int) and (u > c if i == a else u != c):
            raise ShapeInferenceError(f"{node.describe()}: update {update} does not fit past_cache {cache} at axis {i}")
    if len(inputs) > 2 and inputs[2] is not None and (inputs[2].dtype != "int64" or inputs[2].rank != 1):
        raise ShapeInferenceError(f"{node.describe()}: write_indices must be an int64 vector, got {inputs[2]}")
    return [cache]


def _tensor_scatter_attrs(node):
    return {
        "axis": int(node.attr("axis", -2)),
        "circular": choice(node, "mode", "linear", ("linear", "circular")) == "circular",
    }


def _infer_scatter(node, inputs):
    need(node, inputs, 3)
    data, indices, updates = inputs
    want(node, data, ((9, ALL),))
    axis_index(node, int(node.attr("axis", 0)), data.rank)
    if (
        indices.dtype not in ("int32", "int64")
        or indices.shape != updates.shape
        or updates.dtype != data.dtype
        or indices.rank != data.rank
    ):
        raise ShapeInferenceError(
            f"{node.describe()}: indices {indices} and updates {updates} must have one shape and "
            f"the rank of data {data}"
        )
    return [data]


OPS = (
    OpDef(
        "TensorScatter",
        (24,),
        infer=_infer_tensor_scatter,
        fn=k_tensor_scatter,
        flops=lambda node, inputs, outputs: inputs[1].numel(),
        attrs=_tensor_scatter_attrs,
        ATTRS={"axis": INT, "mode": STR},
    ),
    OpDef(
        "Scatter",
        (9,),
        infer=_infer_scatter,
        fn=k_scatter,
        flops=lambda node, inputs, outputs: inputs[2].numel(),
        attrs=lambda node: {"axis": int(node.attr("axis", 0))},
        ATTRS={"axis": INT},
    ),
)
