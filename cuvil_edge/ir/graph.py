"""The Cuvil IR: typed values, nodes and graphs.

A :class:`Graph` is immutable.  Dimensions are ints, symbol names (``"batch"``) or integer
expressions over symbols in canonical text (``"batch*seq+batch"``, see :mod:`cuvil_edge.ir.dims`),
so one graph serves every batch size and sequence length.  Initializers are read-only numpy arrays.
Graphs are built through :func:`cuvil_edge.ir.infer.build_graph`, which checks
structure and infers every value's type from the op registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil_edge.ir import dims, dtypes
from cuvil_edge.ir.dims import Dim

#: Larger dims are treated as malformed: no edge model has 2^31 elements on one axis.
MAX_DIM = 2**31 - 1
#: Larger element counts (of the static dims; a symbol counts 1) are treated as malformed, so that
#: sizes stay far from int64 limits wherever they are multiplied (itemsize, batch, planning).
MAX_ELEMENTS = 2**32
#: Higher ranks are treated as malformed (numpy's own limit).
MAX_RANK = 64
#: Attribute values the IR allows: JSON scalars and flat lists, plus numpy
#: arrays (only for Constant, and folded into initializers by the frontend).
AttrValue = int | float | str | list | tuple | np.ndarray


@dataclass(frozen=True)
class TensorType:
    """Element type and shape; a dim is an int >= 0 or the canonical text of a symbolic dim."""

    dtype: str
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def symbols(self) -> set[str]:
        """The symbol names the dims use (``"4*batch"`` and ``"(seq//16)"`` use one each)."""
        return {name for d in self.shape if isinstance(d, str) for name in dims.symbols_of(d)}

    def bind(self, bindings: Mapping[str, int]) -> TensorType:
        """Replace symbols by sizes (symbols missing from ``bindings`` stay)."""
        return TensorType(self.dtype, tuple(dims.bind(d, bindings) for d in self.shape))

    def numel(self) -> int:
        """Element count of a static type (a symbolic dim counts its value with every symbol 1)."""
        n = 1
        for d in self.shape:
            n *= dims.size_hint(d)
        return n

    def nbytes(self) -> int:
        return self.numel() * dtypes.itemsize(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def of(array: np.ndarray) -> TensorType:
        return TensorType(dtypes.from_numpy(array.dtype), tuple(int(d) for d in array.shape))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class Value:
    """A named, typed edge of the graph."""

    name: str
    type: TensorType


@dataclass(frozen=True, eq=False)
class Node:
    """One op application. ``version`` is the ONNX opset version of its domain."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    version: int = 13

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})"


@dataclass(frozen=True, eq=False)
class Graph:
    """A topologically ordered, fully typed graph.

    ``types`` maps every value name (inputs, initializers, node outputs) to its
    :class:`TensorType`.  Empty input names (optional ONNX inputs) have no type.
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    initializers: Mapping[str, np.ndarray]
    types: Mapping[str, TensorType]
    opset: int

    def producer(self) -> dict[str, Node]:
        """Value name -> the node that produces it."""
        return {out: n for n in self.nodes for out in n.outputs}

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return counts

    def parameter_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.initializers.values())

    def to_dict(self) -> dict[str, Any]:
        """Structure without tensor data (initializers are listed by name only)."""
        return {
            "name": self.name,
            "opset": self.opset,
            "inputs": [{"name": v.name, **v.type.to_dict()} for v in self.inputs],
            "outputs": [{"name": v.name, **v.type.to_dict()} for v in self.outputs],
            "nodes": [
                {
                    "name": n.name,
                    "op": n.op_type,
                    "version": n.version,
                    "inputs": list(n.inputs),
                    "outputs": list(n.outputs),
                    "attrs": {k: _attr_to_json(n, k, v) for k, v in sorted(n.attrs.items())},
                }
                for n in self.nodes
            ],
            "initializers": sorted(self.initializers),
        }


#: Tensor attributes up to this many elements are kept inline in the graph JSON
#: (ConstantOfShape's fill value); bigger ones must be initializers.
MAX_INLINE_TENSOR = 1024


def _attr_to_json(node: Node, key: str, value: AttrValue) -> Any:
    if isinstance(value, np.ndarray):
        if value.size > MAX_INLINE_TENSOR or value.dtype.kind not in "iuf":
            raise ValueError(
                f"{node.describe()} attribute {key!r} holds a {value.dtype}{list(value.shape)} tensor; "
                "fold it into an initializer first"
            )
        return {
            "tensor": {
                "dtype": dtypes.from_numpy(value.dtype),
                "shape": list(value.shape),
                "values": value.ravel().tolist(),
            }
        }
    if isinstance(value, tuple):
        return list(value)
    return value


def readonly(array: np.ndarray) -> np.ndarray:
    """A read-only view (no copy when already read-only)."""
    if array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array
