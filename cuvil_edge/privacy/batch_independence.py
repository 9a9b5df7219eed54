"""Refuse training graphs that mix samples across the batch axis.

DP-SGD clips each sample's gradient and adds noise scaled to that bound, which holds only if
replacing (or adding, removing) one record leaves every *other* sample's gradient unchanged. A
coordinator-supplied graph with ``Softmax(axis=0)``, a reduction or normalisation over the
batch, a Reshape that merges the batch into another axis, ``x @ x.T`` ... breaks that while
DP-SGD still reports its epsilon. :func:`check_batch_independent` runs before the agent
reserves budget for training and refuses such a graph with
:class:`~cuvil_edge.errors.BatchMixingError` naming the node.

Two checks, both must pass:

* **static** (:func:`batch_axes`): from the batched graph inputs (samples on axis 0), every
  value's batch axis is propagated through the allow-list in
  :mod:`cuvil_edge.privacy._batch_rules` (one row per op); a node that would combine different
  samples, or an op the list does not know, is refused;
* **empirical** (:func:`probe_batch_independence`): the IR interpreter runs a seeded random
  batch and each of its rows alone; every output row must match.

The unit of privacy is one record: one row of every batched input (docs/PRIVACY.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np

from cuvil_edge.errors import BatchMixingError, ExecutionError, PrivacyError
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.graph import Dim, Graph, Node, TensorType
from cuvil_edge.ir.infer import known_values
from cuvil_edge.privacy._batch_rules import row_of
from cuvil_edge.privacy._batch_view import CONST, SIZE, State, View, batched, describe, refuse

log = logging.getLogger(__name__)

__all__ = ["BatchMixingError", "batch_axes", "check_batch_independent", "probe_batch_independence"]

#: Size given to symbolic dims other than the batch when probing.
PROBE_DIM = 2
_ALLOW_LIST = "the batch facet of its row in its cuvil_edge/ir/ops file"


def check_batch_independent(
    graph: Graph, *, batch_axis_inputs: Iterable[str] | None = None, probe_rows: int = 4, seed: int = 0
) -> None:
    """Refuse ``graph`` for DP-SGD training if any sample's outputs depend on another sample.

    ``batch_axis_inputs`` names the inputs that carry one sample per index of their axis 0; by
    default every input whose dim 0 is symbolic or larger than 1. The static check
    (:func:`batch_axes`) runs first, then the empirical one (:func:`probe_batch_independence`
    with ``probe_rows`` rows drawn from ``np.random.default_rng(seed)``). When the graph has no
    batched input there is nothing to probe: the empirical check is skipped and the static
    result stands.

    Raises:
        BatchMixingError: a node combines samples (named in the message), an op is not on the
            allow-list, or a probed row's outputs differ when it runs alone.
        PrivacyError: ``batch_axis_inputs`` names an unknown or scalar input, or leaves out an
            input that shares the batch dim; ``probe_rows`` is below 2.
        ExecutionError: the graph fails to run on the probe batch.
    """
    if batch_axis_inputs is not None:
        batch_axis_inputs = tuple(batch_axis_inputs)
    axes = batch_axes(graph, batch_axis_inputs=batch_axis_inputs)
    if not batched_inputs(graph, batch_axis_inputs):
        log.debug("graph %r has no batched input; static check only", graph.name)
        return
    probe_batch_independence(
        graph,
        batch_axis_inputs=batch_axis_inputs,
        output_axes={v.name: axes[v.name] for v in graph.outputs},
        probe_rows=probe_rows,
        seed=seed,
    )


def batched_inputs(graph: Graph, names: Iterable[str] | None = None) -> dict[str, Dim]:
    """The batched inputs and their batch dims: ``names``, or by default every input whose
    dim 0 is a symbol or larger than 1.

    Raises:
        PrivacyError: an unknown or scalar input is named, or an input left out shares a batch symbol.
    """
    inputs = {v.name: v.type for v in graph.inputs}
    if names is None:
        chosen = [n for n, t in inputs.items() if t.rank and (isinstance(t.shape[0], str) or t.shape[0] > 1)]
    else:
        chosen = list(names)
        for n in chosen:
            if n not in inputs or not inputs[n].rank:
                raise PrivacyError(
                    f"batch_axis_inputs names {n!r}, which is not a graph input of rank >= 1 "
                    f"(inputs: {sorted(inputs)}); name the inputs that carry one sample per row"
                )
    dims = {n: inputs[n].shape[0] for n in chosen}
    symbols = {d for d in dims.values() if isinstance(d, str)}
    for n, t in inputs.items():
        if n not in dims and symbols & t.symbols():
            raise PrivacyError(
                f"input {n!r} {t} shares the batch dim {sorted(symbols & t.symbols())} but is not "
                "in batch_axis_inputs; list it there (with the samples on axis 0)"
            )
    return dims


def batch_axes(graph: Graph, *, batch_axis_inputs: Iterable[str] | None = None) -> dict[str, State]:
    """Every value's batch axis (an int), or ``"constant"`` / ``"batch size"`` for values that
    hold no sample (see :mod:`cuvil_edge.privacy._batch_rules`).

    Raises:
        BatchMixingError: a node combines samples, gives a value the batch size on a second axis, or
            its op is not on the allow-list; or a graph output is computed from the batch size.
        PrivacyError: see :func:`batched_inputs`.
        ShapeInferenceError: re-inferring the graph's known values failed (a graph not built by build_graph).
    """
    dims = batched_inputs(graph, batch_axis_inputs)
    symbols = frozenset(d for d in dims.values() if isinstance(d, str))
    known = known_values(graph)
    states: dict[str, State] = {name: CONST for name in graph.initializers}
    states.update({v.name: 0 if v.name in dims else CONST for v in graph.inputs})
    for node in graph.nodes:
        view = View(
            node,
            tuple(states.get(i, CONST) if i else CONST for i in node.inputs),
            tuple(graph.types[i] if i else None for i in node.inputs),
            tuple(graph.types.get(o) if o else None for o in node.outputs),
            known,
            symbols,
        )
        for name, state in zip(node.outputs, _step(view), strict=False):
            if name:
                states[name] = _settle(state, known.get(name), symbols)
                _one_batch_axis(node, name, graph.types[name], states[name], symbols)
    producer = graph.producer()
    for out in graph.outputs:
        if states[out.name] == SIZE:
            raise refuse(
                producer[out.name],
                f"the graph output {out.name!r} is computed from the batch size",
                "output per-sample values only",
            )
    return states


def _one_batch_axis(node: Node, name: str, t: TensorType, state: State, symbols: frozenset[str]) -> None:
    """Refuse a value with the batch size on an axis other than its batch axis (x [batch, 1] expanded to
    [batch, batch]): each sample's slice would then depend on how many records the batch holds."""
    extra = [j for j, d in enumerate(t.shape) if d in symbols and j != state]
    if extra:
        held = f"besides its batch axis {state}" if batched(state) else "yet holds no sample"
        raise refuse(
            node,
            f"its output {name!r} {t} has the batch size on axis {extra[0]} {held}, so each "
            "sample's slice depends on how many records the batch holds",
            "keep the batch size on one axis only",
        )


def _step(v: View) -> list[State]:
    """The output states of one node (the allow-list row's rule, after the checks every row shares)."""
    node, count = v.node, len(v.node.outputs)
    if all(s == CONST for s in v.states):
        return [CONST] * count  # a function of constants alone
    row = row_of(node.op_type)
    if row is None:
        raise BatchMixingError(
            f"op {node.op_type!r} at {describe(node)} is not known to keep samples independent, and its inputs "
            f"depend on the batch; add it to the allow-list ({_ALLOW_LIST}) if it is row-wise, or re-export "
            "the model without it"
        )
    data = range(len(v.states)) if row.data is None else row.data
    for i, state in enumerate(v.states):
        if i not in data and (batched(state) or (state == SIZE and i not in row.shape)):
            raise v.refuse(
                f"its input {i} ({node.inputs[i]!r}), a weight or setting of the op, is computed from "
                f"the {'samples' if batched(state) else 'batch size'}, and only the op's data inputs "
                "may carry samples",
                "compute weights and settings from initializers only",
            )
    carried = [v.states[i] for i in data if i < len(v.states)]
    if not any(batched(s) for s in carried) and not row.creates:
        return [SIZE if SIZE in v.states else CONST] * count
    if SIZE in carried and any(batched(s) for s in carried):
        raise v.refuse(
            "it combines the samples with a value computed from the batch size (a Shape of the "
            "batch), so every sample's output depends on how many records the batch holds",
            "use constants, not the batch size, in per-sample arithmetic",
        )
    result = row.rule(v)
    return [result] * count if isinstance(result, (int, str)) else list(result)


def _settle(state: State, value: np.ndarray | None, symbols: frozenset[str]) -> State:
    """A batch-size value whose known value names no batch symbol is a constant (``Shape(x)[1:]``)."""
    if (
        state == SIZE
        and value is not None
        and not any(str(d) in symbols for d in np.asarray(value).reshape(-1) if isinstance(d, str))
    ):
        return CONST
    return state


def probe_batch_independence(
    graph: Graph,
    *,
    batch_axis_inputs: Iterable[str] | None = None,
    output_axes: Mapping[str, State] | None = None,
    probe_rows: int = 4,
    seed: int = 0,
) -> None:
    """Run a random batch of ``probe_rows`` rows and each row alone through the IR interpreter;
    every output's row (along its batch axis in ``output_axes``; by default 0 where the output's
    dim 0 is a batch dim, else the whole output) must match the row run alone. Inputs are drawn
    from ``np.random.default_rng(seed)`` in their dtype; symbolic dims other than the batch are
    :data:`PROBE_DIM`. When a batched input has a static batch dim, rows cannot run alone:
    each of the first ``probe_rows`` rows is replaced in turn and every other row must keep its
    outputs. Nothing is probed when the graph has no batched input.

    Raises:
        BatchMixingError: an output row differs (the output and row are named), or the graph runs
            on the batch but not on one row alone.
        PrivacyError: ``probe_rows`` is below 2, or see :func:`batched_inputs`.
        ExecutionError: the graph fails to run on the probe batch.
    """
    if isinstance(probe_rows, bool) or not isinstance(probe_rows, int) or probe_rows < 2:
        raise PrivacyError(f"probe_rows must be an int >= 2, got {probe_rows!r}; one row cannot show mixing")
    dims = batched_inputs(graph, batch_axis_inputs)
    if not dims:
        return
    static = sorted({d for d in dims.values() if isinstance(d, int)})
    if len(static) > 1:
        raise PrivacyError(f"the batched inputs have different static batch sizes {static}; they must agree")
    rows = static[0] if static else probe_rows
    rng = np.random.default_rng(seed)
    feeds = _draw(graph, dims, rows, rng)
    axes = dict(output_axes) if output_axes is not None else _default_axes(graph, dims)
    whole = _run(graph, feeds)
    if static:
        _perturb(graph, dims, feeds, whole, axes, rows, min(probe_rows, rows), rng)
        return
    for i in range(rows):
        alone = {n: a[i : i + 1] if n in dims else a for n, a in feeds.items()}
        try:
            single = _run(graph, alone)
        except ExecutionError as e:
            raise BatchMixingError(
                f"the model runs on a batch of {rows} rows but fails on row {i} alone ({e}): "
                "its computation depends on the batch size; DP-SGD's per-sample clipping "
                "cannot bound one record's influence; keep every op row-wise"
            ) from e
        for out in graph.outputs:
            axis = axes.get(out.name, CONST)
            what = (
                f"row {i} run alone differs from row {i} of a {rows}-row batch"
                if batched(axis)
                else f"(no batch axis) differs between a {rows}-row batch and its row {i} alone"
            )
            _compare(out.name, _row(whole[out.name], axis, i), single[out.name], what)
    log.debug("graph %r: %d probe rows each match when run alone", graph.name, rows)


def _perturb(
    graph: Graph,
    dims: Mapping[str, Dim],
    feeds: dict[str, np.ndarray],
    whole: dict[str, np.ndarray],
    axes: Mapping[str, State],
    rows: int,
    count: int,
    rng: np.random.Generator,
) -> None:
    """Static batch: replace row ``i`` of every batched input; the other rows' outputs must not move."""
    for i in range(count):
        fresh = _draw(graph, dims, rows, rng)
        changed = {n: _replace_row(a, fresh[n], i) if n in dims else a for n, a in feeds.items()}
        moved = _run(graph, changed)
        for out in graph.outputs:
            axis = axes.get(out.name, CONST)
            if not batched(axis):
                _compare(
                    out.name,
                    whole[out.name],
                    moved[out.name],
                    f"(no batch axis) changes when only row {i} of the inputs changes",
                )
                continue
            for j in range(rows):
                if j != i:
                    _compare(
                        out.name,
                        _row(whole[out.name], axis, j),
                        _row(moved[out.name], axis, j),
                        f"row {j} changes when only row {i} of the inputs changes",
                    )


def _replace_row(array: np.ndarray, fresh: np.ndarray, i: int) -> np.ndarray:
    out = array.copy()
    out[i] = fresh[i]
    return out


def _default_axes(graph: Graph, dims: Mapping[str, Dim]) -> dict[str, State]:
    batch = set(dims.values())
    return {v.name: 0 if v.type.rank and v.type.shape[0] in batch else CONST for v in graph.outputs}


def _draw(graph: Graph, dims: Mapping[str, Dim], rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random feeds: batch dims ``rows``, other symbols :data:`PROBE_DIM`; normal floats, ints in 0..2, bools."""
    feeds = {}
    for v in graph.inputs:
        shape = tuple(
            rows if (i == 0 and v.name in dims) else d if isinstance(d, int) else PROBE_DIM
            for i, d in enumerate(v.type.shape)
        )
        dtype = np.dtype(v.type.dtype)
        if dtype.kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[v.name] = rng.random(shape) < 0.5
        else:
            feeds[v.name] = rng.integers(0, 3, size=shape).astype(dtype)
    return feeds


def _run(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        return interpreter.run(graph, feeds)
    except ExecutionError as e:
        raise ExecutionError(f"probing graph {graph.name!r} for batch independence: {e}") from e


def _row(array: np.ndarray, axis: State, i: int) -> np.ndarray:
    return np.take(array, [i], axis=axis) if batched(axis) else array  # type: ignore[arg-type]  # batched: an int


def _compare(name: str, want: np.ndarray, got: np.ndarray, what: str) -> None:
    """Raise unless ``got`` matches ``want`` (floats to a relative 1e-4 of the output's scale, others exactly).

    A row run alone and the same row inside a batch take different BLAS blockings, so float32 sums
    differ by a few ulps per accumulation: 1.06e-5 of the scale was measured on the digits CNN's
    softmax after training at ε = 1 (bench_dp_accuracy), which 1e-5 refused. Ops that mix rows
    change a row by far more; the static allow-list above is the primary check.
    """
    same = want.shape == got.shape and want.dtype == got.dtype
    if same and want.dtype.kind == "f":
        tol = max(1e-4, 8 * float(np.finfo(want.dtype).eps))
        # the scale of the finite entries: an inf in the output would make every difference tolerable
        finite = np.abs(want[np.isfinite(want)])
        scale = float(finite.max(initial=0.0))
        same = bool(np.allclose(got, want, rtol=tol, atol=tol * max(scale, 1e-3), equal_nan=True))
    elif same:
        same = bool(np.array_equal(got, want))
    if not same:
        with np.errstate(invalid="ignore"):  # inf - inf where both have an inf: nan, left out by nanmax
            diff = (
                f"max |difference| {float(np.nanmax(np.abs(got.astype(np.float64) - want))):.3g}"
                if want.shape == got.shape and want.size
                else f"shape {list(got.shape)} vs {list(want.shape)}"
            )
        raise BatchMixingError(
            f"the model mixes samples across the batch axis: output {name!r} {what} ({diff}); DP-SGD's "
            "per-sample clipping cannot bound one record's influence, so training is refused; find the op that "
            "combines rows (a softmax, reduction or normalisation over the batch, a Reshape of the batch axis) "
            "and export the model without it"
        )
