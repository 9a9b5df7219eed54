"""Shared logic of the reductions in ``reduce.py`` (private: the name starts with ``_``).

``axes`` is an attribute before the opset where it became input 1 (``since``);
keepdims (default 1) keeps reduced axes as 1; from that opset an empty or absent
axes input reduces every axis unless noop_with_empty_axes=1 (then the op is the identity).
"""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import attr_or_input, axes as norm_axes
from cuvil_edge.ir.ops._util import INT, INTS, need, want_dtype

ATTRS = {"axes": INTS, "keepdims": INT, "noop_with_empty_axes": INT}
NUMBERS = dtypes.FLOATS | {"int32", "int64", "uint32", "uint64", "int8", "uint8"}


def _reduce_axes(x, axes, noop):
    """The kernels' helper: the axes to reduce (non-negative), or None for the identity (noop)."""
    if axes is None or len(axes) == 0:
        return None if noop else tuple(range(x.ndim))
    return tuple(int(a) + x.ndim if int(a) < 0 else int(a) for a in axes)


def attrs(node, since: int) -> dict:
    """The static attributes of a reduction (op contract): keepdims, noop, and axes while it is an attribute."""
    out = {"keepdims": bool(int(node.attr("keepdims", 1))), "noop": noop(node, since)}
    if node.version < since:
        out["axes"] = static_axes(node, since)
    return out


def static_axes(node, since: int):
    """The axes attribute (before ``since``) as a tuple, else None (they come from input 1)."""
    if node.version >= since:
        return None
    value = node.attr("axes")
    return None if value is None else tuple(int(a) for a in value)


def noop(node, since: int) -> int:
    return int(node.attr("noop_with_empty_axes", 0)) if node.version >= since else 0


def infer(node, inputs, consts, since: int, allowed=NUMBERS):
    need(node, inputs, 1, optional=1 if node.version >= since else 0)
    x = inputs[0]
    want_dtype(node, x, allowed)
    axes = attr_or_input(node, consts, "axes", 1, since)
    keep = int(node.attr("keepdims", 1))
    if not axes:
        if noop(node, since):
            return [x]
        axes = list(range(x.rank))
    axes = norm_axes(node, axes, x.rank)
    if x.rank == 0:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 1")
    shape = (
        [1 if i in axes else d for i, d in enumerate(x.shape)]
        if keep
        else [d for i, d in enumerate(x.shape) if i not in axes]
    )
    return [TensorType(x.dtype, tuple(shape))]
