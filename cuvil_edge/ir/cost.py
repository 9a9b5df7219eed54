"""Whole-graph cost: FLOPs per node from the op registry, with symbols bound."""

from __future__ import annotations

from typing import Mapping

from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph


def node_flops(graph: Graph, bindings: Mapping[str, int] | None = None) -> dict[str, int]:
    """FLOPs of every node (a multiply-add counts 2); unbound symbols count as 1 (e.g. per sample)."""
    symbols = {d for t in graph.types.values() for d in t.shape if isinstance(d, str)}
    bindings = {**{s: 1 for s in symbols}, **(bindings or {})}
    out: dict[str, int] = {}
    for node in graph.nodes:
        module = ops.get(node.op_type, node.describe())
        ins = [graph.types[i].bind(bindings) if i else None for i in node.inputs]
        outs = [graph.types[o].bind(bindings) for o in node.outputs if o]
        out[node.name] = int(module.flops(node, ins, outs))
    return out


def total_flops(graph: Graph, bindings: Mapping[str, int] | None = None) -> int:
    return sum(node_flops(graph, bindings).values())
