"""Dead-code elimination: drop nodes none of whose outputs reach a graph output,
and initializers no node reads."""

from __future__ import annotations

from cuvil_edge.errors import PassError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.passes._infra import Pass, PassResult, rebuild


def live_nodes(graph: Graph) -> list:
    """Nodes that contribute to a graph output, in order."""
    needed = {v.name for v in graph.outputs}
    keep = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs if o):
            keep.append(node)
            needed.update(i for i in node.inputs if i)
    return list(reversed(keep))


class DeadCodeElimination(Pass):
    name = "dead-code"

    def rewrite(self, graph: Graph) -> PassResult:
        nodes = live_nodes(graph)
        read = {i for n in nodes for i in n.inputs} | {v.name for v in graph.outputs}
        inits = {k: v for k, v in graph.initializers.items() if k in read}
        kept = {id(n) for n in nodes}
        dropped = [n for n in graph.nodes if id(n) not in kept]
        unused = sorted(set(graph.initializers) - set(inits))
        if not dropped and not unused:
            return PassResult(graph, False)
        changes = [f"removed {n.describe()}" for n in dropped]
        if unused:
            changes.append(
                f"removed {len(unused)} unused initializers ({', '.join(unused[:5])}"
                f"{', ...' if len(unused) > 5 else ''})"
            )
        return PassResult(rebuild(graph, nodes, inits), True, changes)

    def postcondition(self, graph: Graph) -> None:
        if len(live_nodes(graph)) != len(graph.nodes):
            raise PassError("a node that reaches no output is left")
