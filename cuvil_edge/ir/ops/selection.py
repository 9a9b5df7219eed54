"""Ops that select, reorder or frame elements, one table row each (the op contract:
``_contract.py``): NonZero, Compress, Unique, ReverseSequence, CenterCropPad, TopK.

NonZero, Unique and Compress (with a condition known only at run time) have an output length
that depends on the data: inference names it with a symbol of its own (``<output>_count``),
which the run binds like any other symbol. TopK's ``k`` is an attribute before opset 10 and a
constant input from then on: it decides the output shape.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import ALL, FLOATS, NUMERIC, want
from cuvil_edge.ir.ops._shape import scalar, vector
from cuvil_edge.ir.ops._util import INT, INTS, axis_index, data_dependent_dim, dim_product, ints, need, required


def k_non_zero(x):
    if x.ndim == 0:
        return np.zeros((0, int(x != 0)), dtype=np.int64)
    return np.asarray(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


def k_compress(x, condition, axis):
    keep = condition.reshape(-1).astype(bool)
    if axis is None:
        flat = x.reshape(-1)
        return flat[: keep.shape[0]][keep[: flat.shape[0]]]
    n = x.shape[axis]
    return np.compress(keep[:n], x, axis=axis)


def k_unique(x, axis, sorted_, outputs):
    if axis is None:
        values, first, inverse, counts = np.unique(
            x.reshape(-1), return_index=True, return_inverse=True, return_counts=True
        )
    else:
        values, first, inverse, counts = np.unique(
            x, return_index=True, return_inverse=True, return_counts=True, axis=axis
        )
    inverse = inverse.reshape(-1)
    if not sorted_:  # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.shape[0])
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    results = (values, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))
    return results[0] if outputs == 1 else results[:outputs]


def k_reverse_sequence(x, sequence_lens, batch_axis, time_axis):
    steps = x.shape[time_axis]
    lens = sequence_lens.astype(np.int64).reshape(-1)
    t = np.arange(steps).reshape(1, -1)
    src = np.where(t < lens.reshape(-1, 1), lens.reshape(-1, 1) - 1 - t, t)  # (batch, time)
    if batch_axis > time_axis:
        src = src.T
    shape = [1] * x.ndim
    shape[batch_axis], shape[time_axis] = x.shape[batch_axis], steps
    index = np.broadcast_to(src.reshape(shape), x.shape)
    return np.take_along_axis(x, index, axis=time_axis)


def k_center_crop_pad(x, shape, axes):
    chosen = tuple(range(x.ndim)) if axes is None else tuple(a % x.ndim for a in axes)
    sizes = [int(s) for s in np.asarray(shape).reshape(-1)]
    out_shape = list(x.shape)
    source = [slice(None)] * x.ndim
    target = [slice(None)] * x.ndim
    for a, size in zip(chosen, sizes, strict=True):
        have = x.shape[a]
        out_shape[a] = size
        if size < have:  # crop: the extra element of an odd difference is dropped at the end
            start = (have - size) // 2
            source[a] = slice(start, start + size)
        elif size > have:  # pad: the extra zero of an odd difference goes at the end
            start = (size - have) // 2
            target[a] = slice(start, start + have)
    out = np.zeros(out_shape, dtype=x.dtype)
    out[tuple(target)] = x[tuple(source)]
    return out


def k_topk(x, k, axis, largest, sorted_):
    kk = int(np.asarray(k).reshape(-1)[0])
    n = x.shape[axis]
    if largest:  # descending; among equal values the lower index first
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    index = np.take(order, np.arange(kk), axis=axis).astype(np.int64)
    return np.take_along_axis(x, index, axis=axis), index


# --- inference and attributes -----------------------------------------------------------------
def _count(node, what="count"):
    """The symbol naming a data-dependent length of ``node``'s first output."""
    return data_dependent_dim(node, what)


def _infer_non_zero(node, inputs):
    need(node, inputs, 1)
    want(node, inputs[0], ((9, ALL),))
    return [TensorType("int64", (inputs[0].rank, _count(node)))]


def _opt_axis(node):
    axis = node.attr("axis")
    return None if axis is None else int(axis)


def _infer_compress(node, inputs, consts=None):
    need(node, inputs, 2)
    x, condition = inputs
    want(node, x, ((9, ALL),))
    if condition.dtype != "bool" or condition.rank != 1:
        raise ShapeInferenceError(f"{node.describe()}: condition must be a 1-D bool tensor, got {condition}")
    axis = _opt_axis(node)
    length = condition.shape[0]
    whole = dim_product(node, x.shape) if axis is None else x.shape[axis_index(node, axis, x.rank)]
    if isinstance(length, int) and isinstance(whole, int) and length > whole:
        raise ShapeInferenceError(f"{node.describe()}: condition has {length} entries for {whole} elements")
    known = (consts or {}).get(1)
    if known is not None and known.dtype != object:
        kept = int(np.count_nonzero(np.asarray(known).reshape(-1)))
    else:
        kept = _count(node)
    if axis is None:
        return [TensorType(x.dtype, (kept,))]
    a = axis_index(node, axis, x.rank)
    return [TensorType(x.dtype, tuple(kept if i == a else d for i, d in enumerate(x.shape)))]


def _infer_unique(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((11, ALL),))
    axis = _opt_axis(node)
    count = _count(node)
    if axis is None:
        values, n = TensorType(x.dtype, (count,)), dim_product(node, x.shape)
    else:
        a = axis_index(node, axis, x.rank)
        values, n = TensorType(x.dtype, tuple(count if i == a else d for i, d in enumerate(x.shape))), x.shape[a]
    return [values, TensorType("int64", (count,)), TensorType("int64", (n,)), TensorType("int64", (count,))]


def _unique_attrs(node):
    return {"axis": _opt_axis(node), "sorted_": int(node.attr("sorted", 1)), "outputs": len(node.outputs)}


def _infer_reverse_sequence(node, inputs):
    need(node, inputs, 2)
    x, lens = inputs
    want(node, x, ((10, ALL),))
    if x.rank < 2:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 2, got {x}")
    attrs = _reverse_attrs(node)
    if {attrs["batch_axis"], attrs["time_axis"]} != {0, 1}:
        raise UnsupportedAttributeError(f"{node.describe()}: batch_axis and time_axis must be 0 and 1 (either order)")
    if lens.dtype != "int64" or lens.rank != 1:
        raise ShapeInferenceError(f"{node.describe()}: sequence_lens must be an int64 vector, got {lens}")
    batch = x.shape[attrs["batch_axis"]]
    if isinstance(batch, int) and isinstance(lens.shape[0], int) and batch != lens.shape[0]:
        raise ShapeInferenceError(f"{node.describe()}: sequence_lens has {lens.shape[0]} entries for batch {batch}")
    return [x]


def _reverse_attrs(node):
    return {"batch_axis": int(node.attr("batch_axis", 1)), "time_axis": int(node.attr("time_axis", 0))}


def _infer_center_crop_pad(node, inputs, consts=None):
    need(node, inputs, 2)
    x, shape = inputs
    want(node, x, ((18, ALL),))
    sizes = vector(node, consts, 1, "shape")
    axes = _crop_attrs(node)["axes"]
    chosen = list(range(x.rank)) if axes is None else [axis_index(node, a, x.rank) for a in axes]
    if len(chosen) != len(sizes) or any(s < 0 for s in sizes) or len(set(chosen)) != len(chosen):
        raise ShapeInferenceError(f"{node.describe()}: shape {sizes} must give one size >= 0 per axis of {chosen}")
    out = list(x.shape)
    for a, s in zip(chosen, sizes, strict=True):
        if isinstance(out[a], str) and s != out[a]:
            raise ShapeInferenceError(
                f"{node.describe()}: cropping or padding the symbolic dim {out[a]!r} needs it static"
            )
        out[a] = s
    return [TensorType(x.dtype, tuple(out))]


def _crop_attrs(node):
    axes = node.attr("axes")
    return {"axes": None if axes is None else tuple(ints(node, "axes"))}


def _topk_attrs(node):
    return {
        "axis": int(node.attr("axis", -1)),
        "largest": int(node.attr("largest", 1)) if node.version >= 11 else 1,
        "sorted_": int(node.attr("sorted", 1)) if node.version >= 11 else 1,
    }


def _infer_topk(node, inputs, consts=None):
    x = inputs[0]
    want(node, x, ((1, FLOATS), (11, NUMERIC)))
    axis = axis_index(node, int(node.attr("axis", -1)), x.rank)
    if node.version < 10:
        need(node, inputs, 1)
        k = node.attr("k")
    else:
        need(node, inputs, 2)
        k = scalar(node, consts, 1, "k")
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


OPS = (
    OpDef(
        "NonZero", (9, 13), infer=_infer_non_zero, fn=k_non_zero, flops=lambda node, inputs, outputs: inputs[0].numel()
    ),
    OpDef(
        "Compress",
        (9, 11, 28),
        infer=_infer_compress,
        fn=k_compress,
        flops=lambda node, inputs, outputs: inputs[0].numel(),
        attrs=lambda node: {"axis": _opt_axis(node)},
        ATTRS={"axis": INT},
        CONST_INPUTS=(1,),
    ),
    OpDef(
        "Unique",
        (11, 28),
        infer=_infer_unique,
        fn=k_unique,
        flops=lambda node, inputs, outputs: 8 * inputs[0].numel(),
        attrs=_unique_attrs,
        ATTRS={"axis": INT, "sorted": INT},
    ),
    OpDef(
        "ReverseSequence",
        (10, 28),
        infer=_infer_reverse_sequence,
        fn=k_reverse_sequence,
        flops=per_element(0),
        attrs=_reverse_attrs,
        ATTRS={"batch_axis": INT, "time_axis": INT},
    ),
    OpDef(
        "CenterCropPad",
        (18,),
        infer=_infer_center_crop_pad,
        fn=k_center_crop_pad,
        flops=per_element(0),
        attrs=_crop_attrs,
        ATTRS={"axes": INTS},
        CONST_INPUTS=(1,),
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
)
