"""Whole-graph cost: FLOPs per node from the op registry, with symbols bound."""

from __future__ import annotations

from typing import Callable, Mapping

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


def _conv_macs(node, ins, outs) -> int:
    w = ins[1]
    return outs[0].numel() * (w.numel() // w.shape[0]) if w.shape and w.shape[0] else 0


def _conv_transpose_macs(node, ins, outs) -> int:
    # every input element meets every tap of its group's filters: N*C*spatial_in * (M/group * prod(kernel))
    w = ins[1]
    return ins[0].numel() * (w.numel() // w.shape[0]) if w.shape and w.shape[0] else 0


def _gemm_macs(node, ins, outs) -> int:
    a, b = ins[0].shape, ins[1].shape
    k = a[0] if node.attr("transA", 0) else a[-1]
    return outs[0].numel() * (k if isinstance(k, int) else 1)


def _matmul_macs(node, ins, outs) -> int:
    k = ins[0].shape[-1]
    return outs[0].numel() * (k if isinstance(k, int) else 1)


#: Contraction ops whose modules define no ``macs``: multiply-accumulates without bias adds.
MACS: dict[str, Callable] = {"Conv": _conv_macs, "ConvTranspose": _conv_transpose_macs, "Gemm": _gemm_macs,
                             "MatMul": _matmul_macs}


def node_macs(graph: Graph, bindings: Mapping[str, int] | None = None) -> dict[str, int]:
    """Multiply-accumulates of every node: the contractions (Conv, ConvTranspose, Gemm, MatMul and
    ops whose module defines ``macs(node, inputs, outputs)``); elementwise ops, pooling, bias adds
    and activations count 0, as the usual "GMAC" figures (ResNet-18 at 224x224: 1.82 GMAC) do.
    Unbound symbols count as 1."""
    symbols = {d for t in graph.types.values() for d in t.shape if isinstance(d, str)}
    bindings = {**{s: 1 for s in symbols}, **(bindings or {})}
    out: dict[str, int] = {}
    for node in graph.nodes:
        module = ops.get(node.op_type, node.describe())
        rule = getattr(module, "macs", None) or MACS.get(node.op_type)
        if rule is None:
            out[node.name] = 0
            continue
        ins = [graph.types[i].bind(bindings) if i else None for i in node.inputs]
        outs = [graph.types[o].bind(bindings) for o in node.outputs if o]
        out[node.name] = int(rule(node, ins, outs))
    return out


def total_macs(graph: Graph, bindings: Mapping[str, int] | None = None) -> int:
    return sum(node_macs(graph, bindings).values())
