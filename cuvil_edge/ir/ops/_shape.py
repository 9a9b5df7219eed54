"""Helpers private to the shape-manipulating op modules (not an op: the name starts with ``_``).

Constant inputs reach ``infer`` as numpy arrays; 1-D shape vectors computed from
a Shape of a tensor with symbolic dims arrive as ``dtype=object`` arrays whose
entries are Python ints or symbol names (``np.array(["batch", 256], dtype=object)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import Dim, Node, TensorType


def vector(
    node: Node, consts, index: int, what: str, *, required: bool = True, symbols: bool = False
) -> list[Dim] | None:
    """Entries of the 1-D integer constant input ``index`` (None when absent and not required).

    Raises:
        ShapeInferenceError: not constant, not a 1-D integer vector, or holds a
            symbol where ``symbols`` is False.
    """
    value = (consts or {}).get(index)
    present = index < len(node.inputs) and bool(node.inputs[index])
    if value is None:
        if not present and not required:
            return None
        raise ShapeInferenceError(
            f"{node.describe()}: the {what} input (#{index}) must be a constant (initializer, Constant or "
            "shape computation of static dims); its value decides the output shape"
        )
    value = np.asarray(value)
    if value.ndim != 1 or (value.dtype.kind not in "iuO"):
        raise ShapeInferenceError(
            f"{node.describe()}: the {what} input must be a 1-D integer vector, got {value.dtype}{list(value.shape)}"
        )
    out: list[Dim] = []
    for v in value.reshape(-1).tolist():
        if isinstance(v, str):
            if not symbols:
                raise ShapeInferenceError(
                    f"{node.describe()}: the {what} input holds the symbolic dim {v!r} where a number is needed; "
                    "make that dim static"
                )
            out.append(v)
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            out.append(int(v))
        else:
            raise ShapeInferenceError(f"{node.describe()}: the {what} input holds {v!r}, not an integer")
    return out


def scalar(node: Node, consts, index: int, what: str) -> np.ndarray:
    """The one-element constant input ``index`` as a 0-d array (``what`` names it in the error)."""
    value = (consts or {}).get(index)
    if value is None or np.asarray(value).size != 1:
        raise ShapeInferenceError(f"{node.describe()}: {what} must be a constant scalar; it decides the output shape")
    return np.asarray(value).reshape(())


def floats(node: Node, consts, index: int, what: str) -> list[float] | None:
    """Entries of a float constant input (None when absent or empty)."""
    present = index < len(node.inputs) and bool(node.inputs[index])
    if not present:
        return None
    value = (consts or {}).get(index)
    if value is None:
        raise ShapeInferenceError(f"{node.describe()}: the {what} input (#{index}) must be a constant")
    value = np.asarray(value)
    if value.dtype.kind != "f" or value.ndim != 1:
        raise ShapeInferenceError(
            f"{node.describe()}: the {what} input must be a 1-D float vector, got {value.dtype}{list(value.shape)}"
        )
    return [float(v) for v in value.reshape(-1)] or None


def axes(node: Node, values: Sequence[int], rank: int) -> list[int]:
    """Axes normalised to ``0..rank-1``; duplicates and out-of-range axes raise."""
    out = []
    for a in values:
        if not isinstance(a, int) or not -rank <= a < rank:
            raise ShapeInferenceError(f"{node.describe()}: axis {a} is out of range for rank {rank}")
        out.append(a + rank if a < 0 else a)
    if len(set(out)) != len(out):
        raise ShapeInferenceError(f"{node.describe()}: axes {list(values)} repeat an axis")
    return out


def attr_or_input(node: Node, consts, key: str, index: int, since: int, *, required: bool = False):
    """An int-list parameter that is attribute ``key`` before opset ``since`` and input ``index`` from it."""
    if node.version < since:
        value = node.attr(key)
        return None if value is None else [int(v) for v in value]
    return vector(node, consts, index, key, required=required)


def same_rank(node: Node, types: Sequence[TensorType]) -> int:
    ranks = {t.rank for t in types}
    if len(ranks) != 1:
        raise ShapeInferenceError(f"{node.describe()}: inputs have different ranks {[str(t) for t in types]}")
    return ranks.pop()
