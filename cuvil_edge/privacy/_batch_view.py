"""What the batch rules of :mod:`cuvil_edge.privacy._batch_rules` work with: the states a value
can be in (a sample axis, :data:`CONST`, :data:`SIZE`; that module's docstring defines them), the
:class:`View` a rule gets of one node, an allow-list :class:`Row`, the refusal every rule raises,
and the broadcasting checks the elementwise and contraction rules share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cuvil_edge.errors import BatchMixingError
from cuvil_edge.ir.graph import Node, TensorType

CONST = "constant"
SIZE = "batch size"
State = int | str

_CONSEQUENCE = "DP-SGD's per-sample clipping cannot bound one record's influence, so training is refused"


def describe(node: Node) -> str:
    """``node 'sm' (Softmax axis=0, opset 13)``: the node with its scalar and short-list attributes."""
    shown = [
        f"{k}={list(v) if isinstance(v, tuple) else v}"
        for k, v in sorted(node.attrs.items())
        if isinstance(v, (int, float, str)) or (isinstance(v, (list, tuple)) and len(v) <= 8)
    ]
    attrs = f" {', '.join(shown)}" if shown else ""
    return f"node {node.name!r} ({node.op_type}{attrs}, opset {node.version})"


def refuse(node: Node, what: str, fix: str) -> BatchMixingError:
    """The error for ``node``: what it does to the samples, the consequence, and ``fix``."""
    return BatchMixingError(
        f"the model mixes samples across the batch axis at {describe(node)}: {what}; {_CONSEQUENCE}; {fix}"
    )


@dataclass(frozen=True)
class View:
    """What a rule sees of one node: its inputs' states, types and known values, its output types."""

    node: Node
    states: tuple[State, ...]
    types: tuple[TensorType | None, ...]
    outs: tuple[TensorType | None, ...]
    known: Mapping[str, np.ndarray]
    batch_symbols: frozenset[str]

    def value(self, index: int) -> np.ndarray | None:
        """The known value of input ``index`` (None: absent or unknown before running)."""
        name = self.node.inputs[index] if index < len(self.node.inputs) else ""
        return None if not name else self.known.get(name)

    def has(self, index: int) -> bool:
        return index < len(self.node.inputs) and bool(self.node.inputs[index])

    def rank(self, index: int = 0) -> int:
        return self.types[index].rank  # type: ignore[union-attr]  # a required input: present

    def refuse(self, what: str, fix: str) -> BatchMixingError:
        return refuse(self.node, what, fix)


Rule = Callable[[View], State | Sequence[State]]


@dataclass(frozen=True)
class Row:
    """One allow-list entry; ``data`` None means every input is data."""

    rule: Rule
    data: tuple[int, ...] | None = (0,)
    shape: tuple[int, ...] = ()
    creates: bool = False


def batched(state: State) -> bool:
    return isinstance(state, int)


def positive_axis(axis: int, rank: int) -> int:
    """``axis`` counted from the front (an ONNX attribute may count from the back)."""
    return int(axis) + rank if int(axis) < 0 else int(axis)


def align(v: View, slots: Sequence[int], rank: int) -> int:
    """The output axis of the samples when ``slots`` broadcast to ``rank`` dims.

    Raises:
        BatchMixingError: batched inputs carry samples on different output axes (every sample
            would meet every other), or a sample-free input has more than one entry along it
            (each sample would meet a different slice, by its position in the batch).
    """
    axes = {v.states[i] + rank - v.rank(i) for i in slots if batched(v.states[i])}  # type: ignore[operator]  # an axis or state: an int here
    if len(axes) > 1:
        names = ", ".join(
            f"{v.node.inputs[i]!r} {v.types[i]} (samples on axis {v.states[i]})" for i in slots if batched(v.states[i])
        )
        raise v.refuse(
            f"its inputs {names} carry the samples on different axes, so broadcasting pairs every "
            "sample with every other",
            "combine per-sample values whose batch axes line up",
        )
    axis = axes.pop()
    for i in slots:
        if not batched(v.states[i]):
            fits(v, i, axis, rank)
    return axis


def fits(v: View, index: int, axis: int, rank: int) -> None:
    """Check that sample-free input ``index``, broadcast to ``rank`` dims, has size 1 (or no dim) on ``axis``.

    Raises:
        BatchMixingError: it has more entries there: each sample would meet a different slice of
            it, chosen by the sample's position in the batch.
    """
    t = v.types[index]
    offset = axis - (rank - t.rank)  # type: ignore[union-attr]  # a required input: present
    if offset >= 0 and t.shape[offset] != 1:  # type: ignore[union-attr]  # a required input: present
        raise v.refuse(
            f"its input {v.node.inputs[index]!r} {t} holds no sample but has {t.shape[offset]} entries "  # type: ignore[union-attr]  # a required input: present
            "along the batch axis, so each sample meets a different slice depending on its position "
            "in the batch",
            "give that input size 1 along the batch axis",
        )
