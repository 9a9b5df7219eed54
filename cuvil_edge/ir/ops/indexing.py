"""Ops that compute or use positions, one table row each (the op contract: ``_contract.py``):
ArgMax, ArgMin, CumSum, Trilu, Size, CastLike, DepthToSpace, SpaceToDepth.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, no_scratch, per_element
from cuvil_edge.ir.ops._elementwise import ALL, FLOATS, INTS, want
from cuvil_edge.ir.ops._util import INT, STR, axis_index, choice, need, text

NUMERIC = FLOATS | INTS


def k_argmax(x, axis, keepdims, last):
    index = x.shape[axis] - 1 - np.argmax(np.flip(x, axis), axis=axis) if last else np.argmax(x, axis=axis)
    return (np.expand_dims(index, axis) if keepdims else np.asarray(index)).astype(np.int64)


def k_argmin(x, axis, keepdims, last):
    index = x.shape[axis] - 1 - np.argmin(np.flip(x, axis), axis=axis) if last else np.argmin(x, axis=axis)
    return (np.expand_dims(index, axis) if keepdims else np.asarray(index)).astype(np.int64)


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


def k_trilu(x, k=None, upper=1):
    shift = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(x, shift) if upper else np.tril(x, shift)


def k_size(x):
    return np.array(x.size, dtype=np.int64)


def k_cast_like(x, like):
    with np.errstate(all="ignore"):
        return np.asarray(x.astype(like.dtype))


def k_depth_to_space(x, blocksize, crd):
    n, c, h, w = x.shape
    b = blocksize
    if crd:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    return np.ascontiguousarray(y).reshape(n, c // (b * b), h * b, w * b)


def k_space_to_depth(x, blocksize, crd):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b).transpose((0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
    return np.ascontiguousarray(y).reshape(n, c * b * b, h // b, w // b)


# --- inference and attributes -------------------------------------------------------------------
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


def _infer_cumsum(node, inputs):
    need(node, inputs, 2)
    x, axis = inputs
    want(node, x, ((11, NUMERIC),))
    if axis.dtype not in ("int32", "int64") or axis.rank > 1:
        raise ShapeInferenceError(f"{node.describe()}: axis must be an int32/int64 scalar, got {axis}")
    return [x]


def _infer_trilu(node, inputs):
    need(node, inputs, 1, optional=1)
    x = inputs[0]
    want(node, x, ((14, ALL),))
    if x.rank < 2:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 2, got {x}")
    if len(inputs) > 1 and inputs[1] is not None and (inputs[1].dtype != "int64" or inputs[1].rank > 1):
        raise ShapeInferenceError(f"{node.describe()}: k must be an int64 scalar, got {inputs[1]}")
    return [x]


def _infer_size(node, inputs):
    need(node, inputs, 1)
    return [TensorType("int64", ())]


def _infer_cast_like(node, inputs):
    need(node, inputs, 2)
    want(node, inputs[0], ((15, ALL),))
    return [TensorType(inputs[1].dtype, inputs[0].shape)]


def _blocksize(node):
    b = node.attr("blocksize")
    if not isinstance(b, int) or b < 1:
        raise UnsupportedAttributeError(f"{node.describe()} needs a positive blocksize attribute, got {b!r}")
    return b


def _crd(node):
    return choice(node, "mode", "DCR", ("DCR", "CRD")) == "CRD"


def _infer_depth_to_space(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    b = _blocksize(node)
    _crd(node)
    if x.rank != 4:
        raise ShapeInferenceError(f"{node.describe()} needs a 4-D input, got {x}")
    n, c, h, w = x.shape
    if not isinstance(c, int) or c % (b * b):
        raise ShapeInferenceError(f"{node.describe()}: channels {c} must be a multiple of blocksize² = {b * b}")
    scale = lambda d: d * b if isinstance(d, int) else None  # noqa: E731
    if scale(h) is None or scale(w) is None:
        raise ShapeInferenceError(f"{node.describe()}: height and width must be known, got {x}")
    return [TensorType(x.dtype, (n, c // (b * b), scale(h), scale(w)))]


def _infer_space_to_depth(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    b = _blocksize(node)
    if x.rank != 4:
        raise ShapeInferenceError(f"{node.describe()} needs a 4-D input, got {x}")
    n, c, h, w = x.shape
    if not all(isinstance(d, int) for d in (c, h, w)) or h % b or w % b:
        raise ShapeInferenceError(f"{node.describe()}: height and width must be known multiples of {b}, got {x}")
    return [TensorType(x.dtype, (n, c * b * b, h // b, w // b))]


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


OPS: tuple[OpDef, ...] = (
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
        "Trilu",
        (14,),
        infer=_infer_trilu,
        fn=k_trilu,
        flops=per_element(1),
        attrs=lambda node: {"upper": int(node.attr("upper", 1))},
        ATTRS={"upper": INT},
    ),
    OpDef(
        "Size",
        (1, 13, 19, 21, 23, 24, 25),
        infer=_infer_size,
        fn=k_size,
        flops=lambda node, inputs, outputs: 0,
        scratch=no_scratch,
    ),
    OpDef(
        "CastLike",
        (15, 19, 21, 23, 24, 25),
        infer=_infer_cast_like,
        fn=k_cast_like,
        flops=per_element(1),
        ATTRS={"saturate": INT},
        torch=_torch.cast_like,
        scratch=no_scratch,
    ),
    OpDef(
        "DepthToSpace",
        (1, 11, 13, 28),
        infer=_infer_depth_to_space,
        fn=k_depth_to_space,
        flops=lambda node, inputs, outputs: 0,
        attrs=lambda node: {"blocksize": _blocksize(node), "crd": _crd(node) if node.version >= 11 else False},
        ATTRS={"blocksize": INT, "mode": STR},
    ),
    OpDef(
        "SpaceToDepth",
        (1, 13, 28),
        infer=_infer_space_to_depth,
        fn=k_space_to_depth,
        flops=lambda node, inputs, outputs: 0,
        attrs=lambda node: {"blocksize": _blocksize(node), "crd": _crd(node) if node.version >= 28 else False},
        ATTRS={"blocksize": INT, "mode": STR},
    ),
)


# --- Einsum: its own row, after the table above (it parses an equation) -------------------------
def k_einsum(*xs, equation):
    return np.asarray(np.einsum(equation, *xs))


def _einsum_shape(node, equation, inputs):
    """The output shape of ``equation`` over the inputs' shapes (implicit outputs and ellipses included)."""
    from cuvil_edge.ir.ops._elementwise import broadcast_all

    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(inputs):
        raise ShapeInferenceError(
            f"{node.describe()}: equation {equation!r} names {len(terms)} operands, the node has {len(inputs)}"
        )
    dims: dict = {}
    ellipses = []
    for term, t in zip(terms, inputs, strict=True):
        head, dots, tail = term.partition("...")
        spread = t.rank - len(head) - len(tail) if dots else 0
        if spread < 0 or (not dots and len(term) != t.rank):
            raise ShapeInferenceError(f"{node.describe()}: term {term!r} does not fit operand {t}")
        letters = list(head) + [None] * spread + list(tail)
        if dots:
            ellipses.append(tuple(t.shape[len(head) : len(head) + spread]))
        for letter, d in zip(letters, t.shape, strict=True):
            if letter is None:
                continue
            if not letter.isalpha() or (letter in dims and dims[letter] != d):
                raise ShapeInferenceError(f"{node.describe()}: {letter!r} stands for {dims.get(letter)} and {d}")
            dims[letter] = d
    spread_shape = broadcast_all(node, ellipses) if ellipses else ()
    if not arrow:
        rhs = ("..." if ellipses else "") + "".join(sorted(c for c in dims if lhs.count(c) == 1))
    head, dots, tail = rhs.partition("...")
    if any(c not in dims for c in head + tail):
        raise ShapeInferenceError(f"{node.describe()}: output {rhs!r} names a letter no operand has")
    return tuple(dims[c] for c in head) + (tuple(spread_shape) if dots else ()) + tuple(dims[c] for c in tail)


def _infer_einsum(node, inputs):
    from cuvil_edge.ir.ops._util import same_dtype

    if not inputs or any(t is None for t in inputs):
        raise ShapeInferenceError(f"{node.describe()} needs at least one operand")
    dtype = same_dtype(node, inputs)
    want(node, inputs[0], ((12, NUMERIC),))
    return [TensorType(dtype, _einsum_shape(node, text(node, "equation", ""), inputs))]


def _einsum_flops(node, inputs, outputs):
    """2 per multiply-add of the whole loop nest: every letter's size multiplied (symbols count 1),
    times the broadcast (ellipsis) part of the output."""
    lhs, _, rhs = text(node, "equation", "").replace(" ", "").partition("->")
    sizes: dict = {}
    for term, t in zip(lhs.split(","), inputs, strict=True):
        head, _, tail = term.partition("...")
        sizes.update(zip(head, t.shape, strict=False))
        sizes.update(zip(reversed(tail), reversed(t.shape), strict=False))

    def product(dims):
        total = 1
        for d in dims:
            total *= d if isinstance(d, int) else 1
        return total

    lettered = product(sizes[c] for c in rhs.replace("...", "") if c in sizes)
    return 2 * product(sizes.values()) * max(1, outputs[0].numel() // max(1, lettered))


OPS = OPS + (
    OpDef(
        "Einsum",
        (12,),
        infer=_infer_einsum,
        fn=k_einsum,
        flops=_einsum_flops,
        attrs=lambda node: {"equation": text(node, "equation", "")},
        ATTRS={"equation": STR},
        torch=_torch.einsum,
    ),
)
