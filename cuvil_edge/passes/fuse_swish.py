"""SiLU written out as x * sigmoid(x) (how torch exports nn.SiLU) becomes one Swish node:

    Sigmoid(x) → Mul(x, ·)   ⇒  Swish(x, alpha=1)     (either Mul operand order)

One node instead of two reads x once, and FuseActivation can then fold it into the Conv or Gemm
before it (``activation="swish"``). Only when the Sigmoid's output has no other reader and is not
a graph output, and x is floating point. The Swish node carries version 24, the opset that
defines it.
"""

from __future__ import annotations

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import Pass, PassResult, replaced, sole_user, users

SWISH_VERSION = 24
_FLOATS = ("float16", "float32", "float64")


class FuseSwish(Pass):
    name = "fuse-swish"

    def rewrite(self, graph: Graph) -> PassResult:
        uses = users(graph)
        replace: dict[int, Node | None] = {}
        changes = []
        for sigmoid in graph.nodes:
            if sigmoid.op_type != "Sigmoid" or len(sigmoid.inputs) != 1:
                continue
            x, gate = sigmoid.inputs[0], sigmoid.outputs[0]
            mul = sole_user(graph, gate, uses)
            if (
                mul is None
                or mul.op_type != "Mul"
                or sorted(mul.inputs) != sorted((x, gate))
                or graph.types[x].dtype not in _FLOATS
                or graph.types[mul.outputs[0]].shape != graph.types[x].shape
                or id(mul) in replace
            ):
                continue
            replace[id(mul)] = Node(mul.name, "Swish", (x,), mul.outputs, {"alpha": 1.0}, SWISH_VERSION)
            replace[id(sigmoid)] = None
            changes.append(f"{sigmoid.describe()} and {mul.describe()} -> Swish")
        return replaced(graph, replace, changes)
