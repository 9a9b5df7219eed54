"""The pass framework: a pass contract, a fixed-point manager and its report.

A :class:`Pass` checks a precondition, rewrites, and checks a postcondition;
its :class:`PassResult` says whether the graph changed and what changed.  Graphs
are immutable: a rewrite builds a new one with :func:`rebuild` (which re-runs
structure checks and type inference).  The :class:`PassManager` runs a list of
passes until none changes the graph (bounded), checks that every pass keeps
the graph outputs (names and types) and creates only names a package accepts
(:mod:`.naming`), and names the failing pass in its
:class:`~cuvil_edge.errors.PassError`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil_edge.errors import PassError
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.passes.naming import fresh_graph_name, fresh_name, fresh_tensor_name, is_graph_name, is_tensor_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassResult:
    graph: Graph
    modified: bool
    changes: list[str] = field(default_factory=list)


class Pass:
    """One graph rewrite. Subclasses set ``name`` and override :meth:`rewrite` (and the conditions)."""

    name: str = "pass"

    def precondition(self, graph: Graph) -> None:
        """Raise if the pass cannot run on ``graph``."""

    def rewrite(self, graph: Graph) -> PassResult:
        raise NotImplementedError

    def postcondition(self, graph: Graph) -> None:
        """Raise if the rewritten ``graph`` breaks what the pass promises."""

    def __call__(self, graph: Graph) -> PassResult:
        """Precondition, rewrite, postcondition; any failure becomes a PassError naming the pass.

        Raises:
            PassError: a condition failed or the rewrite raised.
        """
        for stage, step in (("precondition", self.precondition), ("rewrite", self.rewrite)):
            try:
                out = step(graph)
            except Exception as e:
                raise PassError(
                    f"pass {self.name!r} failed in its {stage} on graph {graph.name!r}: {type(e).__name__}: {e}"
                ) from e
        result: PassResult = out  # type: ignore[assignment]  # the loop ends on the rewrite
        try:
            self.postcondition(result.graph)
            check_outputs_kept(graph, result.graph)
            check_names_created(graph, result.graph)
        except Exception as e:
            raise PassError(f"pass {self.name!r} failed its postcondition on graph {graph.name!r}: {e}") from e
        return result


def check_outputs_kept(before: Graph, after: Graph) -> None:
    """Every pass keeps the graph's inputs and outputs (names, dtypes, shapes).

    Raises:
        PassError: an input or output changed.
    """
    if [(v.name, v.type) for v in before.outputs] != [(v.name, v.type) for v in after.outputs]:
        raise PassError(
            f"outputs changed from {[str(v.type) + ' ' + v.name for v in before.outputs]} "
            f"to {[str(v.type) + ' ' + v.name for v in after.outputs]}"
        )
    if [(v.name, v.type) for v in before.inputs] != [(v.name, v.type) for v in after.inputs]:
        raise PassError("graph inputs changed")


def check_names_created(before: Graph, after: Graph) -> None:
    """Every name a pass creates is one the package accepts (PACKAGE_SPEC §1.3, :mod:`.naming`):
    a graph that optimizes must also package.  Names the pass found in ``before`` are the
    importer's business, not the pass's.

    Raises:
        PassError: a new initializer, value or node name the package would refuse.
    """
    bad = [f"initializer {n!r}" for n in after.initializers if n not in before.initializers and not is_tensor_name(n)]
    old = all_names(before)
    bad += [f"name {n!r}" for n in all_names(after) - old if not is_graph_name(n)]
    if bad:
        raise PassError(
            f"created names a package refuses: {', '.join(sorted(bad)[:5])}; name new initializers "
            "with naming.fresh_tensor_name, new values and nodes with naming.fresh_graph_name"
        )


@dataclass(frozen=True)
class PassReport:
    """One run of one pass."""

    name: str
    iteration: int
    nodes_before: int
    nodes_after: int
    modified: bool
    changes: tuple[str, ...]


@dataclass(frozen=True)
class OptimizeReport:
    runs: tuple[PassReport, ...]
    iterations: int
    nodes_before: int
    nodes_after: int

    def per_pass(self) -> list[tuple[str, int, int, list[str]]]:
        """(pass, nodes before its first run, that minus the nodes it removed in all its runs,
        all its changes) in pipeline order."""
        out: dict[str, list] = {}
        for r in self.runs:
            entry = out.setdefault(r.name, [r.name, r.nodes_before, r.nodes_before, []])
            entry[2] -= r.nodes_before - r.nodes_after
            entry[3].extend(r.changes)
        return [tuple(v) for v in out.values()]


class PassManager:
    """Runs passes in order, repeatedly, until an iteration changes nothing."""

    def __init__(self, passes: Sequence[Pass], max_iterations: int = 8):
        self.passes = list(passes)
        self.max_iterations = max_iterations

    def run(self, graph: Graph) -> tuple[Graph, OptimizeReport]:
        """Optimize ``graph`` to a fixed point.

        Raises:
            PassError: a pass failed (it is named), or no fixed point within ``max_iterations``.
        """
        runs: list[PassReport] = []
        start = len(graph.nodes)
        for iteration in range(1, self.max_iterations + 1):
            changed = False
            for p in self.passes:
                before = len(graph.nodes)
                result = p(graph)
                graph = result.graph
                changed |= result.modified
                runs.append(
                    PassReport(p.name, iteration, before, len(graph.nodes), result.modified, tuple(result.changes))
                )
                if result.modified:
                    log.debug("pass %s (iteration %d): %s", p.name, iteration, "; ".join(result.changes))
            if not changed:
                return graph, OptimizeReport(tuple(runs), iteration, start, len(graph.nodes))
        raise PassError(
            f"passes {[p.name for p in self.passes]} still change graph {graph.name!r} after "
            f"{self.max_iterations} iterations; last changes: "
            f"{[r.name for r in runs[-len(self.passes) :] if r.modified]}"
        )


# --- helpers shared by passes ---------------------------------------------------
def rebuild(graph: Graph, nodes: Iterable[Node], initializers: Mapping[str, np.ndarray] | None = None) -> Graph:
    """A new graph with the same name, inputs, outputs and opset.

    Raises:
        ModelError: the rewritten graph is malformed or does not type-check.
    """
    inits = graph.initializers if initializers is None else initializers
    return build_graph(graph.name, graph.inputs, [v.name for v in graph.outputs], list(nodes), inits, graph.opset)


def replaced(
    graph: Graph,
    replace: Mapping[int, Node | None],
    changes: list[str],
    initializers: Mapping[str, np.ndarray] | None = None,
) -> PassResult:
    """The result of a rewrite that swaps nodes in place: ``replace`` maps ``id(node)`` to its new
    node, or to None to drop it; unchanged (and ``graph`` itself) when ``changes`` is empty.

    Raises:
        ModelError: the rewritten graph is malformed or does not type-check (as :func:`rebuild`).
    """
    if not changes:
        return PassResult(graph, False)
    nodes = [replace.get(id(n), n) for n in graph.nodes]
    return PassResult(rebuild(graph, [n for n in nodes if n is not None], initializers), True, changes)


def users(graph: Graph) -> dict[str, list[Node]]:
    """Value name -> nodes reading it (a node reading it twice is listed twice)."""
    out: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for name in n.inputs:
            if name:
                out.setdefault(name, []).append(n)
    return out


def sole_user(graph: Graph, value: str, uses: Mapping[str, list[Node]]) -> Node | None:
    """The only node reading ``value`` when it has exactly one reader and is not a graph output."""
    readers = uses.get(value, [])
    if len(readers) != 1 or value in {v.name for v in graph.outputs}:
        return None
    return readers[0]


def all_names(graph: Graph) -> set[str]:
    return set(graph.types) | {n.name for n in graph.nodes}


def rename_inputs(nodes: Iterable[Node], mapping: Mapping[str, str]) -> list[Node]:
    """Nodes with inputs renamed through ``mapping`` (nodes without such inputs unchanged)."""
    out = []
    for n in nodes:
        if any(i in mapping for i in n.inputs):
            n = Node(n.name, n.op_type, tuple(mapping.get(i, i) for i in n.inputs), n.outputs, n.attrs, n.version)
        out.append(n)
    return out


def with_(node: Node, **changes) -> Node:
    """A copy of ``node`` with some fields replaced (``attrs`` merged when given as ``set_attrs``)."""
    attrs = dict(node.attrs)
    attrs.update(changes.pop("set_attrs", {}))
    fields: dict[str, Any] = {
        "name": node.name,
        "op_type": node.op_type,
        "inputs": node.inputs,
        "outputs": node.outputs,
        "attrs": attrs,
        "version": node.version,
    }
    fields.update(changes)
    return Node(**fields)


def initializer(graph: Graph, name: str) -> np.ndarray | None:
    return graph.initializers.get(name) if name else None


__all__ = [
    "Pass",
    "PassResult",
    "PassManager",
    "PassReport",
    "OptimizeReport",
    "rebuild",
    "replaced",
    "users",
    "sole_user",
    "fresh_name",
    "fresh_tensor_name",
    "fresh_graph_name",
    "all_names",
    "rename_inputs",
    "with_",
    "initializer",
    "check_outputs_kept",
    "check_names_created",
]
