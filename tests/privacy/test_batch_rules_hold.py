"""Each declared batch rule is true of its op's kernel: an attack on the allow-list.

The static check (privacy/_batch_rules.py) trusts each op's ``batch`` facet. Here every registered
op that declares one is run by the IR interpreter on representative nodes, with the samples placed
on every axis (of size >= 2) of every data input the rule takes: alone, in pairs, and all on one
axis. Where the rule accepts the placement, each sample is replaced in turn (values resampled from
the same input, so indices stay in range and domains hold) and every *other* sample's slice of each
batched output must stay as it was, and each output the rule calls sample-free (constant or batch
size) must not move at all. Then the samples are rolled by one: each batched output must roll with
them (a sample's output follows the sample, not its position in the batch) and each sample-free one
stay put. A placement the rule refuses is not run: refusing is always safe.

The nodes come from ONNX's node test suite (single-node models with valid inputs, as
tests/conformance collects them), from the op tests' cases in tests/ir (symbolic batch on axis 0,
given 3 samples; the quantized ops' too), and for the fused ops the passes make (which no ONNX test
has) from the Conv and Gemm node tests renamed, plus hand-made CuvilFusedMatMul nodes. Inputs of
size 1 on axis 0 are also widened to 3 samples so that convolutions and pools see a real batch.

The placements are the rules' own inputs (states given to each node alone), with static shapes.
A second test runs the check as training does on the tests/ir cases with a symbolic batch: the
static check over the whole graph, then the probe on every graph it accepts.

Covered: every op of the registry with a batch facet (:data:`DECLARED`, 102 ops, asserted below),
each on all its nodes of those sources (about 870). Not covered by the per-op check:

* ConstantOfShape has no data input: its batched output is made from ``Shape`` of the batch, which
  a single node with static shapes cannot hold; a graph test below checks that path (and Expand's)
  with the static check and the probe together;
* inputs a rule calls weights or settings are never batched here: the shared check in
  batch_independence._step refuses them before any rule runs;
* ops without a batch facet (random ops among them): the static check refuses each one the samples
  reach, so there is no rule to attack. A kernel whose two identical runs differ would make the
  comparison meaningless, so that fails the check too.

The attack itself: ops whose kernels centre, reverse or number the samples on axis 0 but declare
``batch="same"`` are registered for one test each, and the same check catches them; so it does
real kernels (Softmax, LayerNormalization, BatchNormalization, Transpose) given ``same``, and
CuvilFusedMatMul given MatMul's rule unchanged.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import warnings
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.errors import BatchMixingError, CuvilError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter, ops
from cuvil_edge.ir.graph import Graph, Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph, known_values
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, infer_unary
from cuvil_edge.privacy._batch_rules import CONST, State, View, batched, row_of
from cuvil_edge.privacy.batch_independence import _compare, _step

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "conformance"), str(TESTS / "ir")]
import test_ops  # noqa: E402
import test_ops_elementwise  # noqa: E402
import test_ops_quant  # noqa: E402
import test_ops_shape  # noqa: E402
from onnx_cases import Case, build_model, feeds_for  # noqa: E402
from test_conformance_node import node_cases  # noqa: E402

#: every op whose OpDef declares how samples flow through it
DECLARED = sorted(name for name, op in ops.registry().items() if op.batch)
#: samples a batch of the tests/ir cases holds, and how many of them are replaced in turn
SAMPLES = 3


@dataclasses.dataclass(frozen=True)
class Sample:
    """One node with valid values for its inputs (None: an absent optional input)."""

    name: str
    node: Node
    values: tuple[np.ndarray | None, ...]


def _from_graph(name: str, graph: Graph, feeds: Mapping[str, np.ndarray]) -> Sample | None:
    if len(graph.nodes) != 1:
        return None
    (node,) = graph.nodes
    env = {**graph.initializers, **feeds}
    if any(i and (i not in env or np.asarray(env[i]).dtype.kind not in "biuf") for i in node.inputs):
        return None  # an input without a value, or one the graph's dtypes do not hold
    return Sample(name, node, tuple(np.asarray(env[i]) if i else None for i in node.inputs))


@cache
def _onnx_suite() -> dict[str, list[Sample]]:
    found: dict[str, list[Sample]] = {}
    for name, case in node_cases().items():
        if len(case.model.graph.node) != 1 or not case.data_sets:
            continue
        try:
            graph = load_model(case.model.SerializeToString())
        except CuvilError:
            continue  # cases the frontend refuses (tests/conformance/excluded.yaml lists why)
        inputs = case.data_sets[0][0]
        if len(inputs) != len(graph.inputs):
            continue
        sample = _from_graph(name, graph, {v.name: a for v, a in zip(graph.inputs, inputs, strict=True)})
        if sample is not None:
            found.setdefault(sample.node.op_type, []).append(sample)
    return found


@cache
def _ir_graphs() -> tuple[tuple[str, str, Graph, dict[str, np.ndarray]], ...]:
    """The op tests' single-node cases of declared ops, imported (the batch symbolic, given
    :data:`SAMPLES` in the feeds): (id, op type, graph, feeds)."""
    found = []
    for c in (*test_ops.CASES, *test_ops_elementwise.CASES, *test_ops_shape.CASES):
        if isinstance(c, Case) and c.op in DECLARED:
            try:
                found.append((c.id, c.op, load_model(build_model(c)), feeds_for(c, SAMPLES)))
            except Exception:  # noqa: BLE001 - a case built for another purpose (an error path)
                continue
    for q in test_ops_quant.CASES:  # (id, op, args, attrs, opset, output dtype), built by its own helper
        found.append((q[0], q[1], load_model(test_ops_quant.build(q)), test_ops_quant.feeds(q)))
    return tuple(found)


@cache
def _ir_cases() -> dict[str, list[Sample]]:
    found: dict[str, list[Sample]] = {}
    for name, _, graph, feeds in _ir_graphs():
        sample = _from_graph(name, graph, feeds)
        if sample is not None:
            found.setdefault(sample.node.op_type, []).append(sample)
    return found


def _renamed(samples: list[Sample], op_type: str, activation: str) -> list[Sample]:
    """The fused op the passes make from these nodes: the same attributes, plus an activation."""
    return [
        Sample(
            f"{s.name}-as-{op_type}",
            dataclasses.replace(s.node, op_type=op_type, attrs={**s.node.attrs, "activation": activation}, version=1),
            s.values,
        )
        for s in samples
    ]


def _fused_mat_mul() -> list[Sample]:
    """A Linear on (N, T, D), on (N, H, T, D) and on (N, D): A @ W + c, as passes/fuse_bias.py makes it."""
    rng = np.random.default_rng(3)
    out = []
    for shape, activation in (((3, 4, 5), "none"), ((3, 2, 4, 5), "relu"), ((2, 5), "gelu")):
        a, w, c = (rng.standard_normal(s).astype(np.float32) for s in (shape, (5, 6), (6,)))
        node = Node("fmm", "CuvilFusedMatMul", ("a", "w", "c"), ("y",), {"activation": activation}, 1)
        out.append(Sample(f"fused_mat_mul_{len(shape)}d_{activation}", node, (a, w, c)))
    return out


def samples_of(op_type: str) -> list[Sample]:
    if op_type == "CuvilFusedConv":
        found = _renamed(_onnx_suite().get("Conv", []), op_type, "relu")
    elif op_type == "CuvilFusedGemm":
        found = _renamed(_onnx_suite().get("Gemm", []), op_type, "sigmoid")
    elif op_type == "CuvilFusedMatMul":
        found = _fused_mat_mul()
    else:
        found = _onnx_suite().get(op_type, [])
    return found + _ir_cases().get(op_type, [])


# --- the check ------------------------------------------------------------------------------
def _widened(sample: Sample, data: range | tuple[int, ...]) -> Sample | None:
    """Data inputs of size 1 on axis 0 given :data:`SAMPLES` there (the others resampled from it)."""
    rng = np.random.default_rng(1)
    values = list(sample.values)
    grew = False
    for i in data:
        a = values[i] if i < len(values) else None
        if a is not None and a.ndim and a.shape[0] == 1:
            values[i] = np.concatenate([a, *(rng.choice(a.reshape(-1), a.shape) for _ in range(SAMPLES - 1))])
            grew = True
    return dataclasses.replace(sample, name=f"{sample.name}-widened", values=tuple(values)) if grew else None


def _graph(sample: Sample, data: set[int]) -> Graph:
    """The node over graph inputs for its data inputs, initializers (known values) for the rest."""
    inputs, inits, seen = [], {}, set()
    for i, (name, value) in enumerate(zip(sample.node.inputs, sample.values, strict=True)):
        if not name or name in seen:
            continue
        seen.add(name)
        if i in data:
            inputs.append(Value(name, TensorType(value.dtype.name, value.shape)))
        else:
            inits[name] = value
    outputs = [o for o in sample.node.outputs if o]
    return build_graph("attack", inputs, outputs, [sample.node], inits, sample.node.version)


def _placements(sample: Sample, data: range | tuple[int, ...]) -> Iterator[dict[int, int]]:
    """Samples on one axis of one data input, on one axis of each of two inputs of equal size, and
    on the same axis of every data input (elementwise ops whose operands all have that size)."""
    axes = [
        (i, axis)
        for i in data
        if i < len(sample.values) and sample.values[i] is not None
        for axis, size in enumerate(sample.values[i].shape)
        if size >= 2
    ]
    for i, axis in axes:
        yield {i: axis}
    for (i, a), (j, b) in itertools.combinations(axes, 2):
        if i != j and sample.values[i].shape[a] == sample.values[j].shape[b]:
            yield {i: a, j: b}
    present = {i for i, _ in axes}
    if len(present) > 2:
        ranks = {sample.values[i].ndim for i in present}
        for axis in range(min(ranks)):
            sizes = {sample.values[i].shape[axis] for i in present}
            if len(ranks) == 1 and len(sizes) == 1 and sizes.pop() >= 2:
                yield dict.fromkeys(sorted(present), axis)


def _replace(value: np.ndarray, axis: int, k: int, rng: np.random.Generator) -> np.ndarray:
    out = value.copy()
    index = (slice(None),) * axis + (k,)
    out[index] = rng.choice(value.reshape(-1), out[index].shape)
    return out


def check_rule_holds(sample: Sample) -> tuple[int, bool]:
    """Run ``sample`` at each placement its rule accepts and replace each sample in turn.

    Returns (placements the rule accepted, whether any replacement moved its own sample's output: a
    check that only ever compares unchanged outputs shows nothing).

    Raises:
        BatchMixingError: another sample's output slice, or a sample-free output, moved.
    """
    row = row_of(sample.node.op_type)
    assert row is not None, f"{sample.node.op_type} declares no batch rule"
    data = range(len(sample.values)) if row.data is None else row.data
    accepted, moved_own = 0, False
    rng = np.random.default_rng(0)
    for candidate in filter(None, (sample, _widened(sample, data))):
        try:
            graph = _graph(candidate, set(data))
        except CuvilError:
            continue  # a widened node its op does not accept (another input fixes the batch size)
        node, known = graph.nodes[0], known_values(graph)
        feeds = {v.name: candidate.values[node.inputs.index(v.name)] for v in graph.inputs}
        base = _run(graph, feeds)
        assert _same_outputs(base, _run(graph, feeds)), f"{candidate.name}: two identical runs differ"
        for placement in _placements(candidate, data):
            by_name = {node.inputs[i]: axis for i, axis in placement.items()}
            if len(by_name) < len(placement):
                continue  # one value read twice (Add(x, x)) cannot hold its samples on two axes
            view = View(
                node,
                tuple(by_name.get(name, CONST) if name else CONST for name in node.inputs),
                tuple(graph.types[n] if n else None for n in node.inputs),
                tuple(graph.types.get(o) if o else None for o in node.outputs),
                known,
                frozenset(),
            )
            try:
                out_states = dict(zip(node.outputs, _step(view), strict=False))
            except BatchMixingError:
                continue  # refused: the static check would stop the model here
            accepted += 1
            size = candidate.values[next(iter(placement))].shape[next(iter(placement.values()))]
            for k in range(min(size, SAMPLES)):
                changed = dict(feeds)
                for name, axis in by_name.items():
                    changed[name] = _replace(feeds[name], axis, k, rng)
                moved = _run(graph, changed)
                where = f"{candidate.name} with the samples on {placement} (input: axis), sample {k} replaced"
                moved_own |= _compare_outputs(base, moved, out_states, size, k, where)
            _check_rolled(graph, feeds, base, by_name, out_states, f"{candidate.name} with the samples on {placement}")
    return accepted, moved_own


def _check_rolled(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    base: Mapping[str, np.ndarray],
    by_name: Mapping[str, int],
    states: Mapping[str, State],
    where: str,
) -> None:
    """Each sample's output follows the sample, not its position: with the samples rolled by one along
    their axes, each batched output is rolled the same way and each sample-free one stays as it was
    (a constant with one entry per position would give each sample a different one)."""
    rolled = _run(graph, {**feeds, **{n: np.roll(feeds[n], 1, axis=a) for n, a in by_name.items()}})
    for name, want in base.items():
        state = states[name]
        expected = np.roll(want, 1, axis=int(state)) if batched(state) else want
        _compare(name, expected, rolled[name], f"does not follow its samples when they are rolled by one: {where}")


def _run(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return interpreter.run(graph, feeds)


def _same_outputs(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[n], b[n], equal_nan=a[n].dtype.kind in "fc") for n in a)


def _compare_outputs(
    base: Mapping[str, np.ndarray],
    moved: Mapping[str, np.ndarray],
    states: Mapping[str, State],
    size: int,
    k: int,
    where: str,
) -> bool:
    """Every other sample's slice of each batched output, and each sample-free output, unchanged;
    returns whether sample ``k``'s own slice changed."""
    own = False
    for name, want in base.items():
        state, got = states[name], moved[name]
        if not batched(state):
            _compare(name, want, got, f"({state}) changes: {where}")
            continue
        axis = int(state)
        if want.shape[axis] != size:
            raise BatchMixingError(f"output {name!r} {want.shape} has no axis {axis} of {size} samples: {where}")
        for j in range(size):
            w, g = np.take(want, [j], axis=axis), np.take(got, [j], axis=axis)
            if j != k:
                _compare(name, w, g, f"slice {j} along axis {axis} changes: {where}")
            elif not np.array_equal(w, g, equal_nan=w.dtype.kind in "fc"):
                own = True
    return own


# --- every declared rule holds ---------------------------------------------------------------
def test_every_declared_op_is_covered():
    assert len(DECLARED) > 100 and "CuvilFusedMatMul" in DECLARED
    assert not [op for op in DECLARED if not samples_of(op)]
    assert all(row_of(op).data == () for op in FROM_SIZE)


#: ops with no output that follows the samples: nothing moves when a sample is replaced
SAMPLE_FREE = {"Shape"}
#: ops with no data input: their batched output is made from the batch size (Shape), not from samples
FROM_SIZE = {"ConstantOfShape"}


@pytest.mark.parametrize("op_type", sorted(set(DECLARED) - FROM_SIZE))
def test_declared_rule_is_true_of_the_kernel(op_type):
    results = [check_rule_holds(s) for s in samples_of(op_type)]
    assert sum(n for n, _ in results) > 0, f"no node of {op_type} was accepted at any placement"
    assert op_type in SAMPLE_FREE or any(moved for _, moved in results), (
        f"replacing a sample never changed {op_type}'s output: the check saw nothing"
    )


def test_rules_hold_with_a_symbolic_batch():
    """The whole check as training runs it, on the op tests' cases whose inputs have the batch symbol
    on axis 0: where the static check (symbolic dims, batch-size values) accepts a graph, the probe
    (each row run alone against the batch) agrees."""
    from cuvil_edge.errors import PrivacyError
    from cuvil_edge.privacy.batch_independence import batch_axes, probe_batch_independence

    accepted: set[str] = set()
    for _, op_type, graph, _ in _ir_graphs():
        batched = [v.name for v in graph.inputs if v.type.rank and v.type.shape[0] == "batch"]
        if not batched:
            continue
        try:
            axes = batch_axes(graph, batch_axis_inputs=batched)
        except (BatchMixingError, PrivacyError):
            continue  # refused, or the batch symbol also sits off axis 0 of an input
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe_batch_independence(
                graph,
                batch_axis_inputs=batched,
                output_axes={v.name: axes[v.name] for v in graph.outputs},
                probe_rows=SAMPLES,
            )
        accepted.add(op_type)
    assert len(accepted) > 50, sorted(set(DECLARED) - accepted)  # 63 ops when written


def test_values_made_from_the_batch_size_are_the_same_for_every_sample():
    """ConstantOfShape and Expand of a constant to ``Shape(x)``: the rule gives them the batch axis,
    and each sample's slice, run alone or in a batch, is the same (the probe compares them)."""
    from cuvil_edge.privacy.batch_independence import batch_axes, check_batch_independent

    nodes = [
        Node("shape", "Shape", ("x",), ("s",), {}, 13),
        Node("zeros", "ConstantOfShape", ("s",), ("c",), {}, 13),
        Node("row", "Expand", ("k", "s"), ("e",), {}, 13),
        Node("add", "Add", ("x", "c"), ("h",), {}, 13),
        Node("mul", "Mul", ("h", "e"), ("y",), {}, 13),
    ]
    k = np.arange(4, dtype=np.float32)
    g = build_graph("made", [Value("x", TensorType("float32", ("batch", 4)))], ["y"], nodes, {"k": k}, 13)
    assert batch_axes(g)["c"] == 0 and batch_axes(g)["e"] == 0
    check_batch_independent(g)


def test_an_inf_in_an_output_does_not_make_every_difference_tolerable():
    """The comparison's tolerance scales with the output's finite entries (an inf made it infinite)."""
    want = np.array([[np.inf, 1.0], [2.0, 3.0]], np.float32)
    _compare("y", want, want.copy(), "unchanged")
    with pytest.raises(BatchMixingError, match="output 'y' row 1 differs"):
        _compare("y", want, want + np.array([[0, 0], [0, 1]], np.float32), "row 1 differs")


# --- the attack: a wrong rule is caught --------------------------------------------------------
def k_batch_centre(x):
    return x - x.mean(axis=0, keepdims=True)


def k_batch_reverse(x):
    return np.ascontiguousarray(x[::-1])


def k_batch_position(x):
    return x + np.arange(x.shape[0], dtype=x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))


def _infer_unary(node, inputs):
    return infer_unary(node, inputs, ((1, FLOATS),))


#: kernels that combine, reorder or number the samples on axis 0, each declared as if row-wise
WRONG = {
    "centre": OpDef("CuvilBatchCentre", (1,), _infer_unary, k_batch_centre, per_element(2), batch="same"),
    # sample 1 of 3 stays in place: only replacing the others shows the reordering
    "reverse": OpDef("CuvilBatchReverse", (1,), _infer_unary, k_batch_reverse, per_element(0), batch="same"),
    # no sample meets another, but each meets the constant of its position: only rolling shows it
    "position": OpDef("CuvilBatchPosition", (1,), _infer_unary, k_batch_position, per_element(1), batch="same"),
}
CAUGHT = {
    "centre": r"output 'y' slice \d along axis 0 changes: .* on \{0: 0\}",
    "reverse": r"output 'y' slice \d along axis 0 changes: .* on \{0: 0\}",
    "position": r"output 'y' does not follow its samples when they are rolled by one: .* on \{0: 0\}",
}


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_an_op_that_mixes_samples_but_declares_same_is_caught(monkeypatch, kind):
    op = WRONG[kind]
    monkeypatch.setitem(ops.registry(), op.OP_TYPE, op)
    x = np.random.default_rng(0).standard_normal((SAMPLES, 4)).astype(np.float32)
    sample = Sample(kind, Node("wrong", op.OP_TYPE, ("x",), ("y",), {}, 1), (x,))
    with pytest.raises(BatchMixingError, match=CAUGHT[kind]):
        check_rule_holds(sample)


def test_a_node_of_one_sample_is_widened_and_the_wrong_ops_are_still_caught(monkeypatch):
    """ONNX's convolution and pooling nodes hold one sample: widened to three, the mixing shows."""
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    for op in WRONG.values():
        monkeypatch.setitem(ops.registry(), op.OP_TYPE, op)
        with pytest.raises(BatchMixingError, match=r"wide-widened with the samples on \{0: 0\}"):
            check_rule_holds(Sample("wide", Node("wrong", op.OP_TYPE, ("x",), ("y",), {}, 1), (x,)))


@pytest.mark.parametrize("op_type", ["Softmax", "LayerNormalization", "BatchNormalization", "Transpose"])
def test_a_real_kernel_declared_row_wise_is_caught(monkeypatch, op_type):
    """The same check on the registry's own kernels, their rule replaced by ``same``: each of their
    nodes that normalises over (or moves) the samples' axis now passes the static rule and is caught."""
    samples = samples_of(op_type)
    monkeypatch.setitem(ops.registry(), op_type, dataclasses.replace(ops.get(op_type), batch="same"))
    caught = 0
    for sample in samples:
        try:
            check_rule_holds(sample)
        except BatchMixingError:
            caught += 1
    assert caught


def test_the_fused_linear_given_matmuls_rule_unchanged_would_be_caught(monkeypatch):
    """MatMul's rule as it stands (B a data input too) lets samples sit on the weight's columns,
    where each meets the bias entry of its position: why CuvilFusedMatMul takes A as its only data."""
    from cuvil_edge.ir.ops._contract import BatchRule

    fused = ops.get("CuvilFusedMatMul")
    monkeypatch.setitem(
        ops.registry(), fused.OP_TYPE, dataclasses.replace(fused, batch=BatchRule("matmul", data=(0, 1), slots=(0, 1)))
    )
    for sample in _fused_mat_mul():
        with pytest.raises(BatchMixingError, match=r"rolled by one: .* on \{1: 1\}"):
            check_rule_holds(sample)
