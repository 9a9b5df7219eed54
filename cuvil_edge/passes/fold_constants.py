"""Constant folding, shape subgraphs included.

Uses the values :func:`cuvil_edge.ir.infer.known_values` knows before running
(initializers, small constant results evaluated by the ops' kernels, symbolic
shape vectors):

    node whose outputs are all known numeric values        ⇒ initializers holding those values
    Reshape(x, s) with s a symbolic shape vector that       ⇒ Reshape(x, constant)
      has an int64 equivalent ([batch, -1] on [batch, ...]     ([0, -1]: 0 copies the dim)
      is [0, -1])

The subgraph that computed the folded values (Shape -> Gather -> ... ) is left
for dead-code elimination.  A folded value keeps its name when that is a valid
tensor name; torch's ``/Shape_output_0`` is not (PACKAGE_SPEC §1.3), so such a
value becomes an initializer named ``Shape_output_0`` (unique) and its readers
are renamed.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import PassError
from cuvil_edge.ir import shape_values
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.infer import known_values
from cuvil_edge.passes._infra import Pass, PassResult, all_names, fresh_tensor_name, rebuild, rename_inputs, with_
from cuvil_edge.passes.naming import is_tensor_name


def _foldable(node: Node, known: dict[str, np.ndarray], graph: Graph) -> bool:
    """All outputs known and numeric, none a graph output (those keep their producer)."""
    outs = [o for o in node.outputs if o]
    kept = {v.name for v in graph.outputs}
    return bool(outs) and all(o in known and not shape_values.is_symbolic(known[o]) and o not in kept for o in outs)


class ConstantFolding(Pass):
    name = "fold-constants"

    def rewrite(self, graph: Graph) -> PassResult:
        known = known_values(graph)
        taken = all_names(graph)
        inits = dict(graph.initializers)
        nodes, changes, renamed = [], [], {}
        for node in graph.nodes:
            if _foldable(node, known, graph):
                for out in node.outputs:
                    if out:  # never a graph output (_foldable), so its readers can read a new name
                        name = out if is_tensor_name(out) else fresh_tensor_name(taken, out)
                        renamed[out] = name
                        inits[name] = known[out].astype(np.dtype(graph.types[out].dtype), copy=False)
                changes.append(
                    f"folded {node.describe()} into constant {', '.join(renamed[o] for o in node.outputs if o)}"
                )
                continue
            nodes.append(self._concretize(node, graph, known, inits, taken, changes))
        if not changes:
            return PassResult(graph, False)
        return PassResult(rebuild(graph, rename_inputs(nodes, renamed), inits), True, changes)

    @staticmethod
    def _concretize(node, graph, known, inits, taken, changes) -> Node:
        rule = shape_values.CONCRETE.get(node.op_type)
        if rule is None or len(node.inputs) <= rule[0]:
            return node
        index = rule[0]
        value = known.get(node.inputs[index])
        if not shape_values.is_symbolic(value):
            return node
        concrete = shape_values.concrete_input(node, index, value, [graph.types.get(i) for i in node.inputs])
        if concrete is None:
            return node
        name = fresh_tensor_name(taken, f"{node.name}_const{index}")
        inits[name] = concrete
        changes.append(f"{node.describe()} input {index} {list(value)} is now constant {concrete.tolist()}")
        inputs = list(node.inputs)
        inputs[index] = name
        return with_(node, inputs=tuple(inputs))

    def postcondition(self, graph: Graph) -> None:
        known = known_values(graph)
        left = [n.describe() for n in graph.nodes if _foldable(n, known, graph)]
        if left:
            raise PassError(f"nodes with constant outputs are left: {left[:5]}")
