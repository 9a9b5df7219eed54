"""Whole-graph cost: FLOPs per node from the op registry, with symbols bound."""

from __future__ import annotations

from collections.abc import Mapping

from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph


def node_flops(graph: Graph, bindings: Mapping[str, int] | None = None) -> dict[str, int]:
    """FLOPs of every node (a multiply-add counts 2); unbound symbols count as 1 (e.g. per sample)."""
    symbols = {s for t in graph.types.values() for s in t.symbols()}
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


def node_macs(graph: Graph, bindings: Mapping[str, int] | None = None) -> dict[str, int]:
    """Multiply-accumulates of every node: the contractions, whose op definitions carry ``macs``
    next to ``flops`` (Conv, ConvTranspose, Gemm, MatMul, their fused and quantized forms);
    elementwise ops, pooling, bias adds and activations count 0, as the usual "GMAC" figures
    (ResNet-18 at 224x224: 1.82 GMAC) do. Unbound symbols count as 1."""
    symbols = {s for t in graph.types.values() for s in t.symbols()}
    bindings = {**{s: 1 for s in symbols}, **(bindings or {})}
    out: dict[str, int] = {}
    for node in graph.nodes:
        module = ops.get(node.op_type, node.describe())
        rule = getattr(module, "macs", None)
        if rule is None:
            out[node.name] = 0
            continue
        ins = [graph.types[i].bind(bindings) if i else None for i in node.inputs]
        outs = [graph.types[o].bind(bindings) for o in node.outputs if o]
        out[node.name] = int(rule(node, ins, outs))
    return out


def total_macs(graph: Graph, bindings: Mapping[str, int] | None = None) -> int:
    return sum(node_macs(graph, bindings).values())
