"""The allow-list of :mod:`cuvil_edge.privacy.batch_independence`: per op, how the batch axis
maps from a node's inputs to its outputs, or why the node combines different samples.

A value's *state* is one of

* an ``int``: the axis along which its slices are the samples; slice ``i`` depends on sample
  ``i`` alone (and on constants), never on the others nor on how many there are;
* :data:`CONST`: it depends on no sample and not on the batch size (initializers, constants);
* :data:`SIZE`: it depends on the batch size but on no sample's data (``Shape`` of a batched
  value). It may set shapes (Reshape's target, Expand's shape), never meet the samples' data:
  under add/remove-one neighbours the batch size is itself a function of every record.

:func:`row_of` makes an op's :class:`Row` from the ``batch`` facet of its OpDef (a kind of
``ir.ops.BATCH_KINDS``, with its parameters): which inputs are *data* (they may carry samples;
the rule maps their batch axes), which are *shape* inputs (they may be :data:`SIZE`), and the
rule, :data:`RULES` of the kind. Every other input is a weight or setting and must be
:data:`CONST`. A rule sees at least one batched data input (unless its row ``creates`` batched
values from a shape) and returns the output states, or raises
:class:`~cuvil_edge.errors.BatchMixingError` through :func:`refuse`. To allow a new op, give its
row a ``batch`` facet once you are sure it is row-wise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from cuvil_edge.errors import CuvilError
from cuvil_edge.ir import dims as dim_exprs, ops
from cuvil_edge.ir.ops._contract import BATCH_KINDS
from cuvil_edge.privacy._batch_view import (
    CONST,
    SIZE,
    Row,
    State,
    View,
    align,
    batched,
    fits,
    positive_axis,
)


# --- rules ------------------------------------------------------------------------------
def _same(v: View) -> State:
    """Row-wise on input 0: every output keeps its batch axis (unary ops, Cast, Dropout...)."""
    return v.states[0]


def _broadcast(v: View) -> State:
    """Elementwise with numpy broadcasting over every input."""
    return align(v, [i for i in range(len(v.states)) if v.types[i] is not None], v.outs[0].rank)  # type: ignore[union-attr]  # a required input: present


def _softmax(v: View) -> State:
    a, rank, legacy = v.states[0], v.rank(), v.node.version < 13
    axis = positive_axis(v.node.attr("axis", 1 if legacy else -1), rank)
    fix = "export the model with softmax over the class axis (axis=-1 from opset 13, axis=1 before)"
    if legacy and a >= axis:  # type: ignore[operator]  # an axis or state: an int here
        raise v.refuse(
            f"below opset 13 {v.node.op_type} normalises the flattening of axes {axis}..{rank - 1} "
            f"of {v.types[0]}, which includes the batch axis {a}",
            fix,
        )
    if not legacy and a == axis:
        raise v.refuse(f"it normalises over axis {axis} of {v.types[0]}, the batch axis", fix)
    return a


def _reduce(v: View, since: int) -> State:
    """Reduce* ops: ``axes`` is an attribute before opset ``since``, input 1 from it."""
    node, a, rank = v.node, v.states[0], v.rank()
    fix = (
        "reduce only per-sample axes (e.g. axes=[1]) and leave the reduction over the batch to the loss, "
        "outside the model"
    )
    if node.version < since:
        axes = node.attr("axes")
    elif v.has(1):
        axes = v.value(1)
        if axes is None:
            raise v.refuse(
                "its axes are computed while running, so they may include the batch axis",
                "give the axes as a constant",
            )
    else:
        axes = None
    axes = [] if axes is None else [positive_axis(x, rank) for x in np.asarray(axes).reshape(-1)]
    if not axes:
        if node.version >= since and int(node.attr("noop_with_empty_axes", 0)):
            return a
        raise v.refuse(f"without axes it reduces every axis of {v.types[0]}, the batch axis {a} included", fix)
    if a in axes:
        raise v.refuse(f"it reduces axes {sorted(axes)} of {v.types[0]}, which include the batch axis {a}", fix)
    return a if int(node.attr("keepdims", 1)) else a - sum(x < a for x in axes)


def _reshaped(v: View) -> State:
    """Reshape, Flatten, Squeeze, Unsqueeze: the samples survive iff some output axis has the batch
    dim and the same number of elements before it as the input (row-major order then maps each
    sample's elements onto one slice, whatever the other dims become)."""
    a, src, dst = v.states[0], v.types[0].shape, v.outs[0].shape  # type: ignore[union-attr]  # a required input: present
    before = dim_exprs.product(src[:a])  # type: ignore[index]  # an axis or state: an int here
    for k, d in enumerate(dst):
        if d == src[a] and dim_exprs.product(dst[:k]) == before:  # type: ignore[index]  # an axis or state: an int here
            return k
    raise v.refuse(
        f"it turns {v.types[0]} into {v.outs[0]}, so the batch axis {a} ({src[a]!r}) does not survive "  # type: ignore[index]  # an axis or state: an int here
        "as an axis of its own",
        "keep the batch dim first and unchanged (Reshape to [0, -1] or [batch, -1], Flatten with axis=1)",
    )


def _transpose(v: View) -> State:
    perm = [int(p) for p in (v.node.attr("perm") or reversed(range(v.rank())))]
    return perm.index(v.states[0])  # type: ignore[arg-type]  # an axis or state: an int here


def _concat(v: View) -> State:
    rank = v.rank()
    a = align(v, [i for i, s in enumerate(v.states) if batched(s)], rank)
    axis = positive_axis(v.node.attr("axis"), rank)
    if axis == a:
        raise v.refuse(f"it concatenates along axis {axis}, the batch axis", "concatenate along a per-sample axis")
    for i, s in enumerate(v.states):
        if not batched(s):
            raise v.refuse(
                f"its input {v.node.inputs[i]!r} {v.types[i]} holds no sample yet is joined to the samples' slices",
                "expand that input to the batch size first (Expand to [batch, ...])",
            )
    return a


def _split(v: View) -> State:
    a = v.states[0]
    if positive_axis(v.node.attr("axis", 0), v.rank()) == a:
        raise v.refuse(f"it splits {v.types[0]} along axis {a}, the batch axis", "split along a per-sample axis")
    return a


def _vector(v: View, attr: str, index: int, since: int) -> list | None:
    """An int vector from attribute ``attr`` (before opset ``since``) or the known input ``index``."""
    value = v.node.attr(attr) if v.node.version < since else v.value(index)
    return None if value is None else list(np.asarray(value).reshape(-1))


def _slice(v: View) -> State:
    a, rank = v.states[0], v.rank()
    starts = _vector(v, "starts", 1, 10)
    given = v.node.attr("axes") is not None if v.node.version < 10 else v.has(3)
    axes = _vector(v, "axes", 3, 10) if given else list(range(len(starts or ())))
    steps = _vector(v, "steps", 4, 10) if v.node.version >= 10 and v.has(4) else [1] * len(axes or ())
    if starts is None or axes is None or steps is None:
        raise v.refuse(
            "its axes or steps are computed while running, so it may cut the batch axis",
            "give starts, ends, axes and steps as constants",
        )
    axes = [positive_axis(x, rank) for x in axes]
    if a in axes and (int(steps[axes.index(a)]) != 1 or v.outs[0].shape[a] != v.types[0].shape[a]):  # type: ignore[index, union-attr]  # a required input: present; an axis or state: an int here
        raise v.refuse(
            f"it cuts or reorders the batch axis {a} ({v.types[0]} -> {v.outs[0]})", "slice only per-sample axes"
        )
    return a


def _gather(v: View) -> State:
    data, indices = v.states[0], v.states[1]
    axis = positive_axis(v.node.attr("axis", 0), v.rank())
    if batched(data) and batched(indices):
        raise v.refuse(
            "both its data and its indices carry samples, so each sample's indices pick from every sample's data",
            "gather per-sample indices from a constant table (an embedding)",
        )
    if not batched(data):
        return axis + indices  # type: ignore[operator]  # an axis or state: an int here
    if data == axis:
        raise v.refuse(
            f"it picks entries of {v.types[0]} along axis {axis}, the batch axis", "gather along a per-sample axis"
        )
    return data if data < axis else data - 1 + v.rank(1)  # type: ignore[operator]  # an axis or state: an int here


def _pad(v: View) -> State:
    a, rank = v.states[0], v.rank()
    pads = _vector(v, "pads", 1, 11)
    axes = _vector(v, "axes", 3, 18) if v.node.version >= 18 and v.has(3) else list(range(rank))
    if pads is None or axes is None:
        raise v.refuse(
            "its pads are computed while running, so it may pad the batch axis", "give pads (and axes) as constants"
        )
    axes = [positive_axis(x, rank) for x in axes]
    if a in axes and (pads[axes.index(a)] != 0 or pads[axes.index(a) + len(axes)] != 0):
        raise v.refuse(
            f"it pads axis {a}, the batch axis, with rows that are no sample (or copies of others)",
            "pad only per-sample axes",
        )
    return a


def _created(v: View) -> State:
    """Expand / ConstantOfShape of sample-free data: a value whose shape has the batch symbol has
    the same slice for every sample (a class token expanded to [batch, 1, d]). ConstantOfShape's
    input 0 is its shape, which the shared checks keep sample-free: it is never batched here."""
    x = v.states[0]
    if batched(x):
        k = x + v.outs[0].rank - v.rank()  # type: ignore[operator, union-attr]  # a required input: present; an axis or state: an int here
        if v.outs[0].shape[k] != v.types[0].shape[x]:  # type: ignore[index, union-attr]  # a required input: present; an axis or state: an int here
            raise v.refuse(
                f"it broadcasts the batch axis of {v.types[0]} to {v.outs[0]}", "expand only per-sample axes"
            )
        return k
    symbols = [k for k, d in enumerate(v.outs[0].shape) if d in v.batch_symbols]  # type: ignore[union-attr]  # a required input: present
    if symbols:
        return symbols[0]
    return SIZE if SIZE in v.states else CONST


def _windowed(v: View, sample_axes: tuple[int, ...], indices: int | None = None) -> State:
    """Conv and pooling ops take (N, C, spatial...): only ``sample_axes`` may hold the samples.
    Output ``indices`` (MaxPool's) numbers elements across the whole batch: it must be unused."""
    a = v.states[0]
    if a not in sample_axes:
        raise v.refuse(
            f"it combines neighbouring entries along axis {a} of {v.types[0]}, the batch axis",
            "keep the batch on axis 0 of its input (N, C, spatial...)",
        )
    if indices is not None and len(v.node.outputs) > indices and v.node.outputs[indices]:
        raise v.refuse(
            "its Indices output numbers elements across the whole batch, so a sample's indices "
            "depend on its position in the batch",
            f"do not use {v.node.op_type}'s Indices output",
        )
    return a


def _batch_norm(v: View) -> State:
    training = v.node.version >= 14 and int(v.node.attr("training_mode", 0))
    if training or len([o for o in v.node.outputs if o]) > 1:
        raise v.refuse(
            "it runs in training mode and normalises every sample with the mean and variance of the whole batch",
            "export the model in eval mode (model.eval()), or use a norm over per-sample axes (GroupNorm, LayerNorm)",
        )
    if v.states[0] == 1:
        raise v.refuse("its per-channel parameters meet the samples along axis 1", "keep the batch on axis 0")
    return v.states[0]


def _layer_norm(v: View) -> State:
    a, rank = v.states[0], v.rank()
    axis = positive_axis(v.node.attr("axis", -1), rank)
    if a >= axis:  # type: ignore[operator]  # an axis or state: an int here
        raise v.refuse(
            f"it normalises over axes {axis}..{rank - 1} of {v.types[0]}, which include the batch axis {a}",
            "normalise only per-sample axes (axis >= 1 with the batch first)",
        )
    return a


_BOTH = (
    "multiply the samples by weights (initializers), not by each other; products within one sample are "
    "fine when the batch is a leading (broadcast) axis of both operands"
)


def _matmul_axis(side: int, axis: int, ra: int, rb: int) -> tuple[int | None, bool]:
    """(output axis, whether it is a leading broadcast axis) of operand ``side``'s ``axis`` under
    numpy's matmul of ranks ``ra`` @ ``rb``; (None, False) when that axis is summed over."""
    own = ra if side == 0 else rb
    if own == 1 or axis == (own - 1 if side == 0 else own - 2):
        return None, False
    rank = max(ra, rb) if ra > 1 and rb > 1 else (rb - 1 if ra == 1 else ra - 1)
    if side == 0 and axis == own - 2:
        return (rank - 1 if rb == 1 else rank - 2), False
    if side == 1 and axis == own - 1:
        return rank - 1, False
    return axis + (rank - own if ra > 1 and rb > 1 else 0), True


def _matmul(v: View, slots: tuple[int, int], quant: tuple[tuple[int, ...], ...] = ()) -> State:
    """MatMul-like ops on inputs ``slots`` (A, B); ``quant``: the quantization parameters (input
    indices) of A and of B, for the quantized matmuls."""
    ra, rb = v.rank(slots[0]), v.rank(slots[1])
    found = []
    for side, i in enumerate(slots):
        if batched(v.states[i]):
            axis, lead = _matmul_axis(side, v.states[i], ra, rb)  # type: ignore[arg-type]  # an axis or state: an int here
            if axis is None:
                raise v.refuse(
                    f"it sums over axis {v.states[i]} of {v.node.inputs[i]!r} {v.types[i]}, the batch axis",
                    "multiply with the batch on a row (or leading) axis",
                )
            _per_tensor(v, quant[side] if quant else ())
            found.append((axis, lead))
    if len(found) == 2 and (found[0] != found[1] or not found[0][1]):
        raise v.refuse(
            "both operands carry the samples, on different axes (x · xT pairs every sample with every other)", _BOTH
        )
    axis, lead = found[0]
    return align(v, list(slots), max(ra, rb)) if lead and ra > 1 and rb > 1 else axis


def _per_tensor(v: View, params: tuple[int, ...]) -> None:
    """A batched operand's zero points and scales with several entries would be per sample position."""
    for i in params:
        t = v.types[i] if i < len(v.types) else None
        if t is not None and t.numel() > 1:
            raise v.refuse(
                f"its quantization parameter {v.node.inputs[i]!r} {t} has one entry per row or column, "
                "so samples meet different parameters by their position",
                "quantize that operand per tensor",
            )


def _gemm(v: View) -> State:
    """A' (M x K) @ B' (K x N) + C: A's rows become output axis 0, B's columns output axis 1."""
    trans = (int(v.node.attr("transA", 0)), int(v.node.attr("transB", 0)))
    found = []
    for side in (0, 1):
        state = v.states[side]
        if batched(state):
            if state ^ trans[side] != side:  # type: ignore[operator]  # an axis or state: an int here
                raise v.refuse(
                    f"it sums over the batch axis of {v.node.inputs[side]!r} {v.types[side]}",
                    "multiply with the samples as the rows of A",
                )
            found.append(side)
    if len(found) == 2:
        raise v.refuse("both A and B carry samples (x · xT pairs every sample with every other)", _BOTH)
    bias = len(v.states) > 2 and v.types[2] is not None
    if bias and batched(v.states[2]):
        found.append(align(v, [2], 2))  # type: ignore[arg-type]  # an axis or state: an int here
    if len(set(found)) > 1:
        raise v.refuse("A·B and C carry the samples on different axes", "add a bias that lines up with the rows")
    axis = found[0]
    if not batched(v.states[axis]) and v.types[axis].shape[axis ^ trans[axis]] != 1:  # type: ignore[union-attr]  # a required input: present
        raise v.refuse(
            f"{v.node.inputs[axis]!r} {v.types[axis]} holds no sample but spans the batch axis of the "
            "output, so each sample meets a different slice by its position",
            "give it size 1 there",
        )
    if bias and not batched(v.states[2]):
        fits(v, 2, axis, 2)
    return axis


_RESIZE_SAFE = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")


def _resize(v: View) -> State:
    node, a, src = v.node, v.states[0], v.types[0].shape  # type: ignore[union-attr]  # a required input: present
    axes = [positive_axis(x, v.rank()) for x in node.attr("axes", ())] if node.version >= 18 else []
    axes = axes or list(range(v.rank()))
    if a not in axes:
        return a
    where = axes.index(a)
    scales = v.value(1 if node.version < 11 else 2)
    sizes = v.value(3) if node.version >= 11 else None
    coord = "asymmetric" if node.version < 11 else node.attr("coordinate_transformation_mode", "half_pixel")
    policy = node.attr("keep_aspect_ratio_policy", "stretch") if node.version >= 18 else "stretch"
    if sizes is not None and np.size(sizes):
        same = sizes.reshape(-1)[where] == src[a]
    else:
        same = scales is not None and np.size(scales) > where and float(np.asarray(scales).reshape(-1)[where]) == 1.0
    if not same or policy != "stretch" or coord not in _RESIZE_SAFE:
        raise v.refuse(
            f"it resamples axis {a}, the batch axis ({coord}), interpolating between samples",
            "resize only spatial axes (scale 1 on the batch axis)",
        )
    return a


def _quantize(v: View) -> State:
    a, scale = v.states[0], v.types[1]
    if scale.numel() > 1 and scale.rank and positive_axis(v.node.attr("axis", 1), v.rank()) == a:  # type: ignore[union-attr]  # a required input: present
        raise v.refuse(
            f"its scale {v.node.inputs[1]!r} {scale} has one entry per position along the batch axis",
            "quantize per tensor or per channel",
        )
    return a


def _shape(v: View) -> State:
    return SIZE


#: kind of batch facet (ir.ops.BATCH_KINDS) -> its rule, called with the facet's parameters
RULES: dict[str, Callable[..., State | Sequence[State]]] = {
    "same": _same,
    "broadcast": _broadcast,
    "softmax": _softmax,
    "reduce": _reduce,
    "reshaped": _reshaped,
    "transpose": _transpose,
    "concat": _concat,
    "split": _split,
    "slice": _slice,
    "gather": _gather,
    "pad": _pad,
    "created": _created,
    "shape": _shape,
    "windowed": _windowed,
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "matmul": _matmul,
    "gemm": _gemm,
    "resize": _resize,
    "quantize": _quantize,
}
if RULES.keys() != BATCH_KINDS.keys():  # checked even under python -O: a kind without a rule mixes unchecked
    raise CuvilError(
        f"batch kinds without a rule: {sorted(BATCH_KINDS.keys() - RULES.keys())}, rules of no kind: "
        f"{sorted(RULES.keys() - BATCH_KINDS.keys())}; add the rule to privacy/_batch_rules.RULES or the kind "
        "to ir/ops/_contract.BATCH_KINDS"
    )

#: the data inputs of the parameterless kinds named by string (every other kind is a BatchRule)
_DATA: dict[str, tuple[int, ...] | None] = {"broadcast": None}


def row_of(op_type: str) -> Row | None:
    """How samples flow through ``op_type``: the rule of the batch facet its OpDef declares (read
    at each call, so an op registered later is covered), else None."""
    declared = ops.registry().get(op_type)
    facet: Any = declared.batch if declared is not None else None
    if not facet:
        return None
    if isinstance(facet, str):
        return Row(RULES[facet], data=_DATA.get(facet, (0,)))
    rule = partial(RULES[facet.kind], **dict(facet.params))
    return Row(rule, data=facet.data, shape=facet.shape, creates=facet.creates)
