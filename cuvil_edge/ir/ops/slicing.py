"""Ops that cut, join or pad along axes, one table row each (the op contract: ``_contract.py``):
Concat, Split, Slice, Pad. They move data without arithmetic (0 FLOPs).

Parameters that are attributes at old opsets and inputs at newer ones (Split's split from 13,
Slice's starts/ends/axes from 10, Pad's pads and value from 11) reach the kernel as keywords (from
``attrs``) or as arguments (the input's value); the kernel is one function either way. Constant
inputs the output shape depends on are listed in ``CONST_INPUTS``; Concat and Slice also take
symbolic shape vectors (``dtype=object`` arrays, see ``_shape.py``).
"""

from __future__ import annotations

import math

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dims
from cuvil_edge.ir.dims import Expr
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, no_scratch
from cuvil_edge.ir.ops._shape import attr_or_input, axes as norm_axes, same_rank, vector
from cuvil_edge.ir.ops._util import FLOAT, INT, INTS, STR, axis_index, need, same_dtype, text

_BIG = 2**62


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


def k_split(x, split=None, axis=0, count=1, num_outputs=0):
    a = axis + x.ndim if axis < 0 else axis
    dim = x.shape[a]
    if split is None or len(split) == 0:  # equal parts; from opset 18 num_outputs parts, the last smaller
        step = -(-dim // count) if num_outputs else dim // count
        sizes = [max(0, min(step, dim - i * step)) for i in range(count)]
    else:
        sizes = [int(s) for s in split]
    parts = tuple(part.copy() for part in np.split(x, np.cumsum(sizes)[:-1], axis=a))
    return parts[0] if count == 1 else parts


def k_slice(x, starts=None, ends=None, axes=None, steps=None):
    index = [slice(None)] * x.ndim
    along = range(len(starts)) if axes is None or len(axes) == 0 else axes
    strides = [1] * len(starts) if steps is None or len(steps) == 0 else steps
    for start, end, axis, step in zip(starts, ends, along, strides, strict=True):
        a = int(axis) + x.ndim if int(axis) < 0 else int(axis)
        first, stop, stride = slice(int(start), int(end), int(step)).indices(x.shape[a])
        index[a] = slice(first, stop if stop >= 0 else None, stride)
    return x[tuple(index)].copy()


def k_pad(x, pads, value=None, axes=None, mode="constant"):
    widths = [int(p) for p in pads]
    along = (
        range(x.ndim) if axes is None or len(axes) == 0 else [int(a) + x.ndim if int(a) < 0 else int(a) for a in axes]
    )
    grow, crop, k = [(0, 0)] * x.ndim, [slice(None)] * x.ndim, len(widths) // 2
    for i, axis in enumerate(along):
        begin, end = widths[i], widths[i + k]
        grow[axis] = (max(begin, 0), max(end, 0))
        crop[axis] = slice(-min(begin, 0), x.shape[axis] + min(end, 0))  # negative pads crop
    kept = x[tuple(crop)]
    if mode == "constant":
        fill = 0 if value is None or np.size(value) == 0 else np.asarray(value).reshape(-1)[0]
        return np.pad(kept, grow, mode="constant", constant_values=fill)
    return np.pad(kept, grow, mode=mode)


# --- Concat -------------------------------------------------------------------------------------
def _concat_axis(node):
    axis = node.attr("axis")
    if axis is None:
        raise ShapeInferenceError(f"{node.describe()} needs the 'axis' attribute")
    return int(axis)


def _infer_concat(node, inputs):
    """Other axes must agree (a symbol meets an int by taking the int); the joined axis is the sum
    of the inputs' (symbolic ones included: ``1 + seq`` is ``seq+1``). Negative axis from opset 11."""
    if not inputs or any(t is None for t in inputs):
        raise ShapeInferenceError(f"{node.describe()} needs at least one input and no empty ones")
    dtype = same_dtype(node, inputs)
    rank = same_rank(node, inputs)
    axis = axis_index(node, _concat_axis(node), rank)
    out, total = list(inputs[0].shape), 0
    for t in inputs:
        for i, d in enumerate(t.shape):
            if i == axis:
                total = Expr.of(total) + Expr.of(d) if isinstance(d, str) or isinstance(total, Expr) else total + d
            elif d != out[i]:
                if dims.same(d, out[i]):
                    out[i] = dims.simpler(d, out[i])
                elif isinstance(out[i], str):
                    out[i] = d
                elif not isinstance(d, str):
                    raise ShapeInferenceError(
                        f"{node.describe()}: inputs differ on axis {i} ({out[i]} vs {d}); only axis {axis} may differ"
                    )
    out[axis] = total.to_dim() if isinstance(total, Expr) else total
    return [TensorType(dtype, tuple(out))]


# --- Split --------------------------------------------------------------------------------------
def sizes(node, dim: int, split, count: int) -> list[int]:
    """Part lengths along the split axis: ``split`` (attribute before opset 13, input from 13), else
    equal parts; from opset 18 ``num_outputs`` parts of ceil(dim / num_outputs), the last smaller.

    Raises:
        ShapeInferenceError: no outputs, or the split / num_outputs does not cut ``dim`` into ``count`` parts.
    """
    if count < 1:
        raise ShapeInferenceError(f"{node.describe()} has no outputs; Split needs at least one")
    if split:
        if len(split) != count or sum(split) != dim or min(split) < 0:
            raise ShapeInferenceError(f"{node.describe()}: split {list(split)} does not cut {dim} into {count} parts")
        return [int(s) for s in split]
    parts = node.attr("num_outputs") if node.version >= 18 else None
    if parts is not None:
        if int(parts) != count or count < 1:
            raise ShapeInferenceError(f"{node.describe()}: num_outputs={parts} but the node has {count} outputs")
        step = -(-dim // count)
        return [max(0, min(step, dim - i * step)) for i in range(count)]
    if dim % count:
        raise ShapeInferenceError(f"{node.describe()}: axis size {dim} does not divide into {count} equal parts")
    return [dim // count] * count


def _symbolic_sizes(node, dim: str, split, count: int) -> list:
    """Parts of a symbolic axis: the given sizes (the run checks they add up), or equal parts."""
    if split:
        if len(split) != count or min(split) < 0:
            raise ShapeInferenceError(f"{node.describe()}: split {list(split)} does not cut {dim} into {count} parts")
        return [int(s) for s in split]
    if count < 1 or (node.version >= 18 and node.attr("num_outputs") is not None):
        raise ShapeInferenceError(
            f"{node.describe()}: num_outputs parts of the symbolic axis {dim!r} have no static sizes; give split sizes"
        )
    return [dims.floordiv(Expr.of(dim), Expr.const(count)).to_dim()] * count


def _infer_split(node, inputs, consts=None):
    need(node, inputs, 1, optional=1 if node.version >= 13 else 0)
    x = inputs[0]
    axis = axis_index(node, int(node.attr("axis", 0)), x.rank)
    split = attr_or_input(node, consts, "split", 1, 13)
    dim = x.shape[axis]
    if isinstance(dim, str):
        parts = _symbolic_sizes(node, dim, split, len(node.outputs))
    else:
        parts = sizes(node, dim, split, len(node.outputs))
    return [TensorType(x.dtype, x.shape[:axis] + (p,) + x.shape[axis + 1 :]) for p in parts]


def _split_attrs(node):
    out = {
        "axis": int(node.attr("axis", 0)),
        "count": len(node.outputs),
        "num_outputs": int(node.version >= 18 and node.attr("num_outputs") is not None),
    }
    split = node.attr("split") if node.version < 13 else None
    return out if split is None else {"split": tuple(int(s) for s in split), **out}


# --- Slice --------------------------------------------------------------------------------------
def _slice_params(node, consts, rank):
    if node.version < 10:
        starts, ends = list(node.attr("starts", ())), list(node.attr("ends", ()))
        axes, steps = node.attr("axes"), None
        axes = list(axes) if axes is not None else None
    else:
        starts = vector(node, consts, 1, "starts", symbols=True)
        ends = vector(node, consts, 2, "ends", symbols=True)
        axes = vector(node, consts, 3, "axes", required=False)
        steps = vector(node, consts, 4, "steps", required=False)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeInferenceError(f"{node.describe()}: starts, ends, axes and steps differ in length")
    if 0 in steps:
        raise ShapeInferenceError(f"{node.describe()}: a step is 0")
    return starts, ends, norm_axes(node, axes, rank), steps


def length(dim: int, start: int, end: int, step: int) -> int:
    """Elements x[start:end:step] has along an axis of size ``dim`` (ONNX clamping)."""
    return len(range(*slice(start, end, step).indices(dim)))


def symbolic_length(dim, start, end, step: int):
    """``len(range(dim)[start:end:step])`` for symbolic dims or bounds (``step >= 1``). Bounds that
    are symbolic, static starts and negative offsets from a symbolic end are taken to lie within
    the axis, as the models that write them mean (``x[:, :seq]`` of a longest-sequence buffer,
    ``x[-2:]`` of a rolled window axis, ``x[:, 1::2]`` of a patch grid); a static end on a symbolic
    axis is clamped exactly (``min(5,seq)``)."""
    size = Expr.of(dim)

    def clamp(bound, is_end: bool) -> Expr:
        if isinstance(bound, int):
            if is_end and bound >= _BIG // 4:
                return size
            if size.is_const():
                return Expr.const(min(max(bound + size.constant() if bound < 0 else bound, 0), size.constant()))
            if bound < 0:
                return size + bound
            return dims.minimum(Expr.const(bound), size) if is_end else Expr.const(bound)
        return size if dims.provably_le(size, Expr.of(bound)) else Expr.of(bound)

    span = clamp(end, True) - clamp(start, False)
    if dims.provably_le(span, Expr.const(0)):
        return 0
    return (span if step == 1 else dims.floordiv(span + (step - 1), Expr.const(step))).to_dim()


def _infer_slice(node, inputs, consts=None):
    """Starts and ends clamp like Python slices. Symbolic bounds or axes give symbolic lengths
    (step 1 or more); a symbolic bound on a static axis is taken to lie within it: a buffer of the
    longest sequence sliced to the sequence (GPT-2's causal mask) is ``seq`` long, not ``min(seq, 1024)``."""
    need(node, inputs, 1, optional=4 if node.version >= 10 else 0)
    x = inputs[0]
    out = list(x.shape)
    for start, end, axis, step in zip(*_slice_params(node, consts, x.rank), strict=True):
        dim = x.shape[axis]
        if isinstance(dim, str) or isinstance(start, str) or isinstance(end, str):
            if step < 0:
                raise ShapeInferenceError(
                    f"{node.describe()}: slicing axis {axis} ({dim!r}) from {start!r} to {end!r} step {step} "
                    "backwards gives a size that depends on a symbol; make that dim static"
                )
            out[axis] = symbolic_length(dim, start, end, step)
            continue
        out[axis] = length(dim, start, end, step)
    return [TensorType(x.dtype, tuple(out))]


def _slice_attrs(node):
    if node.version >= 10:
        return {}
    axes = node.attr("axes")
    return {
        "starts": tuple(int(s) for s in node.attr("starts", ())),
        "ends": tuple(int(e) for e in node.attr("ends", ())),
        **({} if axes is None else {"axes": tuple(int(a) for a in axes)}),
    }


# --- Pad ----------------------------------------------------------------------------------------
def _mode(node):
    mode = text(node, "mode", "constant")
    allowed = ("constant", "reflect", "edge") + (("wrap",) if node.version >= 19 else ())
    if mode not in allowed:
        raise UnsupportedAttributeError(
            f"{node.describe()}: mode {mode!r} is not supported at opset {node.version}; "
            f"supported: {', '.join(allowed)}"
        )
    return mode


def _infer_pad(node, inputs, consts=None):
    """pads (begin..., end...): attribute before opset 11, else input 1; the constant value an
    attribute (< 11) or optional input 2; axes input 3 from 18; wrap mode from 19; negative pads crop."""
    need(node, inputs, 1, optional=0 if node.version < 11 else (2 if node.version < 18 else 3))
    x, mode = inputs[0], _mode(node)
    value = inputs[2] if len(inputs) > 2 else None
    if value is not None and (value.dtype != x.dtype or not (value.is_static and value.numel() <= 1)):
        raise ShapeInferenceError(f"{node.describe()}: constant_value {value} must be a {x.dtype} scalar like the data")
    pads = (
        attr_or_input(node, consts, "pads", 1, 11, required=True)
        if node.version < 11
        else vector(node, consts, 1, "pads", symbols=True)
    )
    axes = vector(node, consts, 3, "axes", required=False) if node.version >= 18 else None
    axes = list(range(x.rank)) if axes is None else norm_axes(node, axes, x.rank)
    if pads is None or len(pads) != 2 * len(axes):
        raise ShapeInferenceError(f"{node.describe()}: pads {pads} must have 2 x {len(axes)} entries for {x}")
    out = list(x.shape)
    for i, axis in enumerate(axes):
        begin, end, dim = pads[i], pads[i + len(axes)], x.shape[axis]
        if begin == end == 0:
            continue
        if isinstance(dim, str) or isinstance(begin, str) or isinstance(end, str):
            if mode != "constant":
                raise ShapeInferenceError(
                    f"{node.describe()}: {mode} padding of axis {axis} ({dim!r}) by {begin!r}, "
                    f"{end!r} needs static sizes to check the pads fit"
                )
            out[axis] = dims.maximum(Expr.of(dim) + Expr.of(begin) + Expr.of(end), Expr.const(0)).to_dim()
            continue
        if (
            dim + min(begin, 0) + min(end, 0) < 0
            or (mode == "reflect" and max(begin, end) >= dim)
            or (mode != "constant" and dim == 0)
        ):
            raise ShapeInferenceError(
                f"{node.describe()}: pads {begin}, {end} do not fit axis {axis} of size {dim} in mode {mode}"
            )
        out[axis] = dim + begin + end
    return [TensorType(x.dtype, tuple(out))]


def _pad_attrs(node):
    if node.version >= 11:
        return {"mode": _mode(node)}
    value = float(node.attr("value", 0.0))
    return {
        "pads": tuple(int(p) for p in node.attr("pads", ())),
        "value": value if math.isfinite(value) else str(value),  # "nan", "inf": numpy parses the text
        "mode": _mode(node),
    }


def _zero(node, inputs, outputs):
    return 0


OPS = (
    OpDef(
        "Concat",
        (4, 11, 13),
        batch=BatchRule("concat", data=None),
        infer=_infer_concat,
        fn=k_concat,
        flops=_zero,
        attrs=lambda node: {"axis": _concat_axis(node)},
        ATTRS={"axis": INT},
        torch=_torch.concat,
        scratch=no_scratch,
    ),
    OpDef(
        "Split",
        (2, 11, 13, 18),
        batch=BatchRule("split", shape=(1,)),
        infer=_infer_split,
        fn=k_split,
        flops=_zero,
        attrs=_split_attrs,
        ATTRS={"axis": INT, "num_outputs": INT, "split": INTS},
        CONST_INPUTS=(1,),
        torch=_torch.split,
        scratch=no_scratch,
    ),
    OpDef(
        "Slice",
        (1, 10, 11, 13),
        batch=BatchRule("slice", shape=(1, 2, 3, 4)),
        infer=_infer_slice,
        fn=k_slice,
        flops=_zero,
        attrs=_slice_attrs,
        ATTRS={"starts": INTS, "ends": INTS, "axes": INTS},
        CONST_INPUTS=(1, 2, 3, 4),
        torch=_torch.slice_,
        scratch=no_scratch,
    ),
    OpDef(
        "Pad",
        (2, 11, 13, 18, 19, 21, 23, 24, 25),
        batch=BatchRule("pad", shape=(1, 3)),
        infer=_infer_pad,
        fn=k_pad,
        flops=_zero,
        attrs=_pad_attrs,
        ATTRS={"mode": STR, "pads": INTS, "value": FLOAT},
        CONST_INPUTS=(1, 3),
        torch=_torch.pad,
        torch_check=_torch.check_pad,
    ),
)
