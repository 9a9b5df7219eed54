"""GELU written out as its erf formula becomes one Gelu node (what torch exports before opset 20):

    Div(x, √2) → Erf → Add(·, 1) → Mul(x, ·) → Mul(·, 0.5)     ⇒  Gelu(x)
    Mul(x, 1/√2) → Erf → Add(·, 1) → Mul(Mul(x, 0.5), ·)       ⇒  Gelu(x)

(either operand order for each Add and Mul). One node instead of five runs one pass over the
tensor instead of five, and targets with native kernels evaluate it as 0.5 x erfc(-x/√2), which
does not cancel for x << 0. Only when every intermediate has one reader and is not a graph
output, the constants are scalar initializers (within 1e-6 relative), x is floating point and the
result has x's shape. The Gelu node carries version 20, the opset that defines it.
"""

from __future__ import annotations

import math

import numpy as np

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import Pass, PassResult, initializer, replaced, sole_user, users

GELU_VERSION = 20
_FLOATS = ("float16", "float32", "float64")


def _scalar(graph: Graph, name: str) -> float | None:
    value = initializer(graph, name)
    if value is None or np.asarray(value).size != 1 or np.asarray(value).dtype.kind != "f":
        return None
    return float(np.asarray(value).reshape(-1)[0])


def _close(value: float | None, want: float) -> bool:
    return value is not None and math.isclose(value, want, rel_tol=1e-6)


def _split(graph: Graph, node: Node, want: float) -> str | None:
    """The non-constant operand of a binary ``node`` whose other operand is the scalar ``want``."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if _close(_scalar(graph, b), want):
        return a
    if node.op_type != "Div" and _close(_scalar(graph, a), want):
        return b
    return None


def _other(node: Node, name: str) -> str | None:
    """The operand of a two-input ``node`` that is not ``name``."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _match(graph: Graph, erf: Node, uses, producer) -> tuple[str, list[Node]] | None:
    """(x, the nodes that compute gelu(x), last one first) for the pattern around ``erf``."""
    scale = producer.get(erf.inputs[0])
    if scale is None or sole_user(graph, erf.inputs[0], uses) is not erf:
        return None
    if scale.op_type == "Div":
        x = _split(graph, scale, math.sqrt(2))
    elif scale.op_type == "Mul":
        x = _split(graph, scale, 1 / math.sqrt(2))
    else:
        return None
    add = sole_user(graph, erf.outputs[0], uses)
    if x is None or add is None or add.op_type != "Add" or _split(graph, add, 1.0) != erf.outputs[0]:
        return None
    product = sole_user(graph, add.outputs[0], uses)
    if product is None or product.op_type != "Mul":
        return None
    factor = _other(product, add.outputs[0])
    if factor == x:  # x * (1 + erf), then * 0.5
        half = sole_user(graph, product.outputs[0], uses)
        if half is None or half.op_type != "Mul" or _split(graph, half, 0.5) != product.outputs[0]:
            return None
        return x, [half, product, add, erf, scale]
    halved = producer.get(factor) if factor else None  # (x * 0.5) * (1 + erf)
    if (
        halved is None
        or halved.op_type != "Mul"
        or _split(graph, halved, 0.5) != x
        or factor is None
        or sole_user(graph, factor, uses) is not product
    ):
        return None
    return x, [product, add, erf, scale, halved]


class FuseGelu(Pass):
    name = "fuse-gelu"

    def rewrite(self, graph: Graph) -> PassResult:
        uses, producer = users(graph), graph.producer()
        replace: dict[int, Node | None] = {}
        changes = []
        for erf in graph.nodes:
            if erf.op_type != "Erf" or not erf.inputs:
                continue
            found = _match(graph, erf, uses, producer)
            if found is None:
                continue
            x, chain = found
            out = chain[0].outputs[0]
            if (
                any(id(n) in replace for n in chain)
                or graph.types[x].dtype not in _FLOATS
                or graph.types[out].shape != graph.types[x].shape
            ):
                continue
            # the Gelu takes the place of the chain's last node: x exists by then, and so before any reader of out
            replace[id(chain[0])] = Node(chain[0].name, "Gelu", (x,), (out,), {}, GELU_VERSION)
            for n in chain[1:]:
                replace[id(n)] = None
            changes.append(f"{len(chain)} nodes from {chain[-1].describe()} to {chain[0].describe()} -> Gelu")
        return replaced(graph, replace, changes)
