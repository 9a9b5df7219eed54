"""Common-subexpression elimination.

    two nodes with the same op, version, attributes and inputs  ⇒ keep the first, readers of the
                                                                  second read the first's outputs
    two initializers with the same dtype, shape and bytes       ⇒ keep one

A duplicate whose output is a graph output stays (the graph keeps its output names).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import Pass, PassResult, rebuild, rename_inputs


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return (type(value).__name__, value)


def node_key(node: Node) -> tuple:
    return (
        node.op_type,
        node.version,
        node.inputs,
        len(node.outputs),
        tuple(sorted((k, _freeze(v)) for k, v in node.attrs.items())),
    )


def _array_key(array: np.ndarray) -> tuple:
    return (array.dtype.str, array.shape, hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest())


class CommonSubexpressionElimination(Pass):
    name = "cse"

    def rewrite(self, graph: Graph) -> PassResult:
        outputs = {v.name for v in graph.outputs}
        mapping: dict[str, str] = {}
        changes: list[str] = []
        first: dict[tuple, str] = {}
        inits = {}
        for name, array in graph.initializers.items():
            key = _array_key(array)
            if key in first and name not in outputs:
                mapping[name] = first[key]
                changes.append(f"initializer {name!r} is a copy of {first[key]!r}")
            else:
                first.setdefault(key, name)
                inits[name] = array
        seen: dict[tuple, Node] = {}
        nodes: list[Node] = []
        for node in graph.nodes:
            node = rename_inputs([node], mapping)[0]
            key = node_key(node)
            twin = seen.get(key)
            if twin is not None and not any(o in outputs for o in node.outputs):
                mapping.update({o: t for o, t in zip(node.outputs, twin.outputs, strict=True) if o})
                changes.append(f"{node.describe()} repeats {twin.describe()}")
                continue
            seen.setdefault(key, node)
            nodes.append(node)
        if not changes:
            return PassResult(graph, False)
        return PassResult(rebuild(graph, nodes, inits), True, changes)
