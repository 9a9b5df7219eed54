"""Linear algebra, one table row each (the op contract: ``_contract.py``): Det (determinants of
the trailing square matrices; float16 is computed in float32 and rounded once), Einsum (products
and sums over the axes an equation names) and Trilu (the upper or lower triangle of the trailing
matrices, from diagonal ``k``).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import ALL, FLOATS, NUMERIC, want
from cuvil_edge.ir.ops._util import INT, STR, need, text


def k_det(x):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    return np.asarray(np.linalg.det(w).astype(x.dtype))


def k_einsum(*xs, equation):
    return np.asarray(np.einsum(equation, *xs))


def k_trilu(x, k=None, upper=1):
    shift = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(x, shift) if upper else np.tril(x, shift)


def _infer_det(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((11, FLOATS),))
    if x.rank < 2 or (isinstance(x.shape[-1], int) and isinstance(x.shape[-2], int) and x.shape[-1] != x.shape[-2]):
        raise ShapeInferenceError(f"{node.describe()} needs square matrices [..., M, M], got {x}")
    return [TensorType(x.dtype, x.shape[:-2])]


def _det_flops(node, inputs, outputs):
    m = inputs[0].shape[-1] if isinstance(inputs[0].shape[-1], int) else 1
    return outputs[0].numel() * (2 * m**3) // 3


# --- Einsum: the output shape and FLOPs come from parsing the equation --------------------------
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


def _infer_trilu(node, inputs):
    need(node, inputs, 1, optional=1)
    x = inputs[0]
    want(node, x, ((14, ALL),))
    if x.rank < 2:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 2, got {x}")
    if len(inputs) > 1 and inputs[1] is not None and (inputs[1].dtype != "int64" or inputs[1].rank > 1):
        raise ShapeInferenceError(f"{node.describe()}: k must be an int64 scalar, got {inputs[1]}")
    return [x]


OPS = (
    OpDef("Det", (11, 22), infer=_infer_det, fn=k_det, flops=_det_flops),
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
    OpDef(
        "Trilu",
        (14,),
        infer=_infer_trilu,
        fn=k_trilu,
        flops=per_element(1),
        attrs=lambda node: {"upper": int(node.attr("upper", 1))},
        ATTRS={"upper": INT},
    ),
)
