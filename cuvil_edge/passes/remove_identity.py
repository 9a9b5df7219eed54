"""Identity and inference-Dropout removal: readers of the output read the input instead.

Pattern table (``op`` ⇒ condition under which it is a no-op):

    Identity                               ⇒ always
    Dropout (no mask read, inference mode) ⇒ training_mode absent or constant false (opset >= 12);
                                             is_test or opset >= 7 before that

When the removed node's output is a graph output, the producer of its input is
renamed to the output name instead (the graph keeps its output names); when that
is impossible (the input is a graph input, initializer or another output) the node stays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil_edge.errors import PassError
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import Pass, PassResult, rebuild, rename_inputs, with_


def _dropout_is_noop(graph: Graph, node: Node) -> bool:
    if len(node.outputs) > 1 and node.outputs[1] and any(node.outputs[1] in n.inputs for n in graph.nodes):
        return False
    if node.outputs[1:2] and node.outputs[1] in {v.name for v in graph.outputs}:
        return False
    if node.version >= 12:
        if len(node.inputs) < 3 or not node.inputs[2]:
            return True
        flag = graph.initializers.get(node.inputs[2])
        return flag is not None and not bool(np.asarray(flag).reshape(-1)[0])
    return node.version >= 7 or bool(node.attr("is_test", 0))


#: op -> is this node a no-op passing input 0 to output 0?
NOOPS: dict[str, Callable[[Graph, Node], bool]] = {
    "Identity": lambda graph, node: True,
    "Dropout": _dropout_is_noop,
}


class RemoveIdentity(Pass):
    name = "remove-identity"

    def rewrite(self, graph: Graph) -> PassResult:
        nodes, changes = list(graph.nodes), []
        while True:
            step = self._remove_one(graph, nodes)
            if step is None:
                break
            nodes, change = step
            changes.append(change)
        if not changes:
            return PassResult(graph, False)
        return PassResult(rebuild(graph, nodes), True, changes)

    @staticmethod
    def _remove_one(graph: Graph, nodes: list[Node]) -> tuple[list[Node], str] | None:
        outputs = {v.name for v in graph.outputs}
        fixed = set(graph.initializers) | {v.name for v in graph.inputs}
        for node in nodes:
            rule = NOOPS.get(node.op_type)
            if rule is None or not node.inputs or not node.inputs[0] or not rule(graph, node):
                continue
            src, dst = node.inputs[0], node.outputs[0]
            rest = [n for n in nodes if n is not node]
            if dst not in outputs:
                rest = rename_inputs(rest, {dst: src})
            elif src in fixed or src in outputs:
                continue
            else:  # the producer of src now writes dst directly
                rest = [with_(n, outputs=tuple(dst if o == src else o for o in n.outputs)) for n in rest]
                rest = rename_inputs(rest, {src: dst})
            return rest, f"removed {node.describe()}"
        return None

    def postcondition(self, graph: Graph) -> None:
        for node in graph.nodes:
            if node.op_type == "Identity" and node.outputs[0] not in {v.name for v in graph.outputs}:
                raise PassError(f"{node.describe()} is left")
