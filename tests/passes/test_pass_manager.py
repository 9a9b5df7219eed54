"""The pass manager: fixed point, per-pass report, and errors that name the failing pass."""

from __future__ import annotations

import pytest

from cuvil_edge.errors import PassError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.passes import DeadCodeElimination, Pass, PassManager, PassResult, RemoveIdentity, optimize
from cuvil_edge.passes._infra import rebuild, with_

from pass_helpers import assert_same_outputs, graph_from_text, op_types, w

TEXT = """g (float[N, 4] x) => (float[N, 3] y) {
    i = Identity(x)
    h = MatMul(i, W)
    y0 = Add(h, b)
    dead = Relu(y0)
    y = Relu(y0)
}"""


class Broken(Pass):
    name = "broken"

    def rewrite(self, graph: Graph) -> PassResult:
        raise ValueError("boom")


class RenamesOutput(Pass):
    name = "renames-output"

    def rewrite(self, graph: Graph) -> PassResult:
        nodes = [with_(n, op_type="Sigmoid") if n.op_type == "Relu" else n for n in graph.nodes]
        return PassResult(rebuild(graph, nodes), True, ["relu -> sigmoid"])

    def postcondition(self, graph: Graph) -> None:
        raise ValueError("sigmoid is not allowed here")


class NeverDone(Pass):
    name = "never-done"

    def rewrite(self, graph: Graph) -> PassResult:
        return PassResult(graph, True, ["claims a change"])


def test_default_pipeline_reaches_fixed_point_with_report():
    g = graph_from_text(TEXT, W=w(4, 3), b=w(3))
    out, report = optimize(g)
    assert op_types(out) == ["CuvilFusedGemm"]
    assert report.nodes_before == 5 and report.nodes_after == 1
    assert report.runs[-1].iteration == report.iterations and not any(
        r.modified for r in report.runs if r.iteration == report.iterations)
    per_pass = {name: (before, after, changes) for name, before, after, changes in report.per_pass()}
    assert per_pass["remove-identity"][2] == ["removed node 'Identity_0' (Identity)"]
    assert per_pass["fuse-bias"][0] == 3 and per_pass["fuse-bias"][1] == 2
    assert_same_outputs(g, out)
    again, second = optimize(out)
    assert second.iterations == 1 and op_types(again) == op_types(out)


@pytest.mark.parametrize("bad,stage", [(Broken(), "rewrite"), (RenamesOutput(), "postcondition")])
def test_manager_error_names_failing_pass(bad, stage):
    g = graph_from_text(TEXT, W=w(4, 3), b=w(3))
    with pytest.raises(PassError, match=f"pass '{bad.name}' failed.*{stage}"):
        PassManager([RemoveIdentity(), bad, DeadCodeElimination()]).run(g)


def test_manager_bounds_iterations():
    g = graph_from_text(TEXT, W=w(4, 3), b=w(3))
    with pytest.raises(PassError, match="never-done.*after 3 iterations"):
        PassManager([NeverDone()], max_iterations=3).run(g)
