"""Memory plan of a compiled module: its peak bytes, known before it runs (DESIGN.md §3, "Local build").

It walks the generated ``_forward``: nodes in graph order, a buffer freed when the module ``del``s
the last name reaching it (:func:`release_schedule`; a view op shares its input's buffer), inputs
held by the caller's ``feeds``, weights by ``W``. Peak = weights + max over steps of (live
activations + the kernel's transient *scratch*, the ``scratch`` facet of its op, read from the
kernel's source and checked against tracemalloc in tests/device_targets/test_memory_plan.py; an op
declaring none is estimated at one output-sized temporary) + :data:`OVERHEAD_BYTES`. Issue 12 bounds it
by weights + the two largest simultaneously-live activations + 10 % (:meth:`MemoryPlan.over_bound`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cuvil_edge.device_targets.spec import TargetSpec, resolve
from cuvil_edge.errors import BuildError, CuvilError
from cuvil_edge.ir import dims, dtypes, ops
from cuvil_edge.ir.graph import Graph, Node, TensorType
from cuvil_edge.ir.ops._contract import no_scratch
from cuvil_edge.ir.ops._packing import packed_conv_bytes

#: Python objects one run creates (frames, argument tuples, the feeds and outputs dicts): 1-4 KiB measured.
OVERHEAD_BYTES = 2048


def is_view(node: Node) -> bool:
    """Whether ``node``'s kernel returns a view of its first input as output 0 (its op's ``view``
    facet): no allocation, and the input's buffer lives as long as the view."""
    return ops.get(node.op_type, node.describe()).view


@dataclass(frozen=True)
class Site:
    """What an op's scratch facet sees of one call: runtime types (batch bound, float16 applied) and the
    kernel paths the target takes (``large_scratch``: im2col; ``native``: the C kernels load)."""

    attrs: Mapping[str, Any]
    # TensorTypes whose dims are bound to ints (the batch substituted), None for an absent optional
    # input. Typed Any: TensorType's dims are int | str and its absence None, neither of which a
    # rule meets where it reads them (required inputs, bound dims), so the type cannot say it.
    ins: tuple[Any, ...]
    outs: tuple[Any, ...]
    large_scratch: bool
    native: bool

    out = property(lambda self: sum(self.nbytes(t) for t in self.outs))  # bytes of the outputs
    inp = property(lambda self: self.nbytes(self.ins[0]) if self.ins else 0)  # bytes of the first input

    @staticmethod
    def nbytes(t: TensorType | None) -> int:
        return 0 if t is None else t.numel() * dtypes.itemsize(t.dtype)

    def input(self, index: int) -> TensorType | None:
        return self.ins[index] if len(self.ins) > index else None  # None: an absent optional input

    def buffer(self, nbytes: int | None = None, item: int | None = None) -> int:
        """numpy's iterator buffer for a ufunc with a broadcast or strided operand writing ``nbytes``
        (default: the first input's size) of ``item``-byte elements (default: the first input's):
        one block of ``np.getbufsize()`` elements at most (8192 float32: 32 KiB, measured)."""
        item = item or dtypes.itemsize(self.ins[0].dtype)
        return min(self.inp if nbytes is None else nbytes, np.getbufsize() * item)


@dataclass(frozen=True)
class Step:
    """One call (or a step of the module's wrapper), in bytes; peak = live + scratch."""

    index: int
    node: str
    op_type: str
    live_bytes: int  # activations alive during the call, its new outputs included
    scratch_bytes: int
    after_bytes: int  # alive once the module has deleted what this node read last
    estimated: bool  # the op declares no scratch facet: one output-sized temporary assumed
    peak_bytes = property(lambda self: self.live_bytes + self.scratch_bytes)


@dataclass(frozen=True)
class MemoryPlan:
    """Planned memory of one build, in bytes: ``peak_bytes`` = weights (+ float16 copies, + the
    native GEMM's packed weights) + the worst step + :data:`OVERHEAD_BYTES`."""

    graph: str
    target: str
    precision: str
    batch: int
    low_memory: bool  # the target lacks TARGET_LARGE_SCRATCH: kernels take their low-memory paths
    native: bool  # the plan assumes the C kernels load
    weights_bytes: int  # the package's initializers (the caller holds them as W)
    runtime_weights_bytes: int  # copies the module makes each run (float16 builds cast W)
    steps: tuple[Step, ...]
    peak_bytes: int
    peak_step: int
    largest_live: tuple[tuple[str, int], ...]  # the two largest simultaneously-live activations
    packed_weights_bytes: int = 0  # the native GEMM's packed copies of weights, made once, held with them

    @property
    def bound_bytes(self) -> int:
        """Weights (and their packed copies) plus the two largest simultaneously-live activations: a
        floor the plan is compared with, so that ``over_bound`` can name the steps that need far more
        than it."""
        return self.weights_bytes + self.packed_weights_bytes + sum(size for _, size in self.largest_live)

    def over_bound(self, slack: float = 0.10) -> tuple[Step, ...]:
        """The steps whose planned peak exceeds the bound by more than ``slack``, worst first."""
        room = self.bound_bytes * (1 + slack) - self.weights_bytes - self.runtime_weights_bytes - OVERHEAD_BYTES
        room -= self.packed_weights_bytes
        return tuple(sorted((s for s in self.steps if s.peak_bytes > room), key=lambda s: -s.peak_bytes))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field (steps as dicts) and the bound."""
        return {**asdict(self), "largest_live": [list(p) for p in self.largest_live], "bound_bytes": self.bound_bytes}

    def describe(self) -> str:
        """A few lines for a build report."""
        mb = lambda b: f"{b / 2**20:.3f} MiB"  # noqa: E731
        w = self.steps[self.peak_step] if self.steps else Step(0, "-", "-", 0, 0, 0, False)
        kernels = ", low-memory kernels" * self.low_memory + ", native kernels" * self.native
        over, guessed = self.over_bound(), sorted({s.op_type for s in self.steps if s.estimated})
        weights = self.weights_bytes + self.runtime_weights_bytes + self.packed_weights_bytes
        largest = " + ".join(f"{n!r} {mb(b)}" for n, b in self.largest_live)
        return "\n".join(
            [
                f"memory plan for {self.graph!r} on {self.target} "
                f"({self.precision}, batch {self.batch}{kernels}): peak "
                f"{mb(self.peak_bytes)} = weights {mb(weights)} + live "
                f"{mb(w.live_bytes)} + scratch {mb(w.scratch_bytes)} at {w.node!r} ({w.op_type})",
                f"bound: weights + {largest} = {mb(self.bound_bytes)}",
                *(
                    [
                        "over the bound + 10 %: "
                        + ", ".join(f"{s.node!r} ({s.op_type}, scratch {mb(s.scratch_bytes)})" for s in over[:5])
                    ]
                    if over
                    else []
                ),
                *([f"scratch estimated (no scratch facet): {', '.join(guessed)}"] if guessed else []),
            ]
        )


def release_schedule(graph: Graph) -> list[list[str]]:
    """Per node, the value names the generated ``_forward`` deletes right after it: outputs nobody
    reads and the inputs it reads last, graph outputs excepted (codegen._forward_source's rule)."""
    last_use = {name: index for index, node in enumerate(graph.nodes) for name in node.inputs if name}
    keep = {v.name for v in graph.outputs}
    schedule = []
    for index, node in enumerate(graph.nodes):
        dead = [o for o in node.outputs if o and o not in keep and o not in last_use]
        dead += [i for i in dict.fromkeys(node.inputs) if i and last_use.get(i) == index and i not in keep]
        schedule.append(list(dict.fromkeys(dead)))
    return schedule


def plan_memory(
    graph: Graph, target: TargetSpec | str, *, precision: str = "fp32", batch: int = 1, native: bool | None = None
) -> MemoryPlan:
    """Plan the peak memory of ``graph`` compiled for ``target``, run on ``batch`` samples.

    ``native``: whether the C kernels load where the module runs (None: the target has them and
    they load in this process, as they would for the module).

    Raises:
        UnknownTargetError, TargetSpecError: ``target`` names no valid spec.
        TargetError: the target does not support ``precision``.
        BuildError: ``batch`` is not a positive int (or not 1 for a graph without a batch dim), the
            inputs lead with several symbols, a value keeps a symbolic dim other than the batch, or
            a node's attributes are invalid.
    """
    spec = resolve(target)
    caps = spec.capabilities(precision)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise BuildError(f"batch must be a positive int, got {batch!r}")
    leading = {
        name
        for v in graph.inputs
        if v.type.shape and isinstance(v.type.shape[0], str)
        for name in dims.symbols_of(v.type.shape[0])
    }
    if len(leading) > 1:
        raise BuildError(
            f"graph {graph.name!r} inputs lead with several symbols {sorted(leading)}; the memory plan "
            "binds one batch symbol. Export the model with one batch axis shared by its inputs"
        )
    symbol = leading.pop() if leading else None
    if symbol is None and batch != 1:
        raise BuildError(f"graph {graph.name!r} has no symbolic batch dim (its inputs fix it); plan with batch=1")
    fp16, static = bool(caps["COMPUTE_FP16"]), bool(spec.static_shapes and symbol)
    if native is None:  # as the module will: the C kernels when the target has them and they load here
        try:
            from cuvil_edge.ir.ops._native import library  # lazily: the first call may compile them

            native = bool(caps.get("TARGET_NATIVE")) and library() is not None
        except ImportError:  # a tree without the native kernels
            native = False
    step = spec.static_batch if static else batch  # static-shape targets run fixed-size chunks
    bind = lambda size: {symbol: size} if symbol else {}  # noqa: E731
    full, types = _Types(graph, bind(batch), False), _Types(graph, bind(step), fp16)
    chunks, out_step = -(-batch // step), sum(types.bytes(v.name) for v in graph.outputs)
    held = 0  # bytes outside _forward's values: the caller's inputs when the wrapper feeds new arrays
    if fp16 or static:
        held = sum(full.bytes(v.name) for v in graph.inputs) + (chunks - 1) * out_step
        held += sum(_Types(graph, bind(batch), True).bytes(v.name) for v in graph.inputs) if fp16 and static else 0
        held -= sum(types.bytes(v.name) for v in graph.inputs) if static and batch % step == 0 else 0  # views
    steps, pair = _simulate(graph, types, bool(caps["TARGET_LARGE_SCRATCH"]), native, held)
    last = steps[-1].after_bytes if steps else held + sum(types.bytes(v.name) for v in graph.inputs)
    wrapper = [("(static batch) concatenate chunks", held + (chunks + 1) * out_step)] * static
    wrapper += [("(float16) cast outputs to float32", last + sum(full.bytes(v.name) for v in graph.outputs))] * fp16
    steps += [
        Step(len(steps) + i, name, "(module wrapper)", live, 0, live, False) for i, (name, live) in enumerate(wrapper)
    ]
    copies = sum(int(a.size) * 2 for a in graph.initializers.values() if fp16 and a.dtype == np.float32)
    worst = max(range(len(steps)), key=lambda i: steps[i].peak_bytes, default=0)
    packed = packed_conv_bytes(graph, types, bool(caps["TARGET_LARGE_SCRATCH"])) if native else 0
    weights = graph.parameter_bytes()
    peak = weights + copies + packed + (steps[worst].peak_bytes if steps else last) + OVERHEAD_BYTES
    return MemoryPlan(
        graph.name,
        spec.name,
        precision,
        batch,
        not caps["TARGET_LARGE_SCRATCH"],
        native,
        weights,
        copies,
        tuple(steps),
        peak,
        worst,
        pair,
        packed,
    )


class _Types(dict):
    """Runtime types by value name ("" for an absent input): the batch bound; float32 is float16 when
    the module computes in float16.

    Raises:
        BuildError: a dim stays symbolic once the batch is bound.
    """

    def __init__(self, graph: Graph, bindings: Mapping[str, int], fp16: bool) -> None:
        super().__init__({"": None})
        for name, t in graph.types.items():
            if not (t := t.bind(bindings)).is_static:
                raise BuildError(
                    f"value {name!r} of graph {graph.name!r} has shape {list(t.shape)}: a dim is neither fixed nor "
                    f"the batch ({', '.join(bindings) or 'none'}), so its size is unknown before running. Give "
                    "the largest size of each such axis in the site's limits.dims (e.g. {seq: 128}), or "
                    "export the model with that axis fixed"
                )
            self[name] = TensorType("float16", t.shape) if fp16 and t.dtype == "float32" else t

    def bytes(self, name: str) -> int:
        return Site.nbytes(self[name])


def _scratch(node: Node, types: _Types, large: bool, native: bool) -> tuple[int, bool]:
    """(scratch bytes of ``node``'s call, whether estimated).

    Raises:
        BuildError: the node's attributes cannot be read, or its op's scratch facet does not fit it.
    """
    op = ops.get(node.op_type, node.describe())
    if op.scratch is no_scratch:
        return 0, False
    try:
        attrs = op.attrs(node)
        site = Site(attrs, tuple(types[i] for i in node.inputs), tuple(types[o] for o in node.outputs), large, native)
        return (max(0, int(op.scratch(site))), False) if op.scratch else (site.out, True)
    except CuvilError:
        raise
    except Exception as e:  # a facet that does not fit this node must name it
        raise BuildError(f"memory plan of {node.describe()} failed: {type(e).__name__}: {e}") from e


def _simulate(
    graph: Graph, types: _Types, large: bool, native: bool, held: int
) -> tuple[list[Step], tuple[tuple[str, int], ...]]:
    """The steps of ``_forward``, tracking live buffers; and the two buffers alive together whose
    sum is largest, as (value name, bytes)."""
    pinned = {v.name for v in graph.inputs}  # the caller's feeds hold them
    owner: dict[str, str | None] = {**{k: None for k in graph.initializers}, **{k: k for k in pinned}}
    size, names = {k: types.bytes(k) for k in pinned}, {k: 1 for k in pinned}  # per buffer: bytes, names reaching it
    live, steps = sum(size.values()), []
    pair = tuple(sorted(size.items(), key=lambda kv: -kv[1])[:2])
    for index, (node, dead) in enumerate(zip(graph.nodes, release_schedule(graph), strict=True)):
        for position, out in enumerate(node.outputs):
            if out and position == 0 and is_view(node) and node.inputs and node.inputs[0]:
                base = owner[out] = owner.get(node.inputs[0])
                if base is not None:
                    names[base] += 1
            elif out:
                owner[out], size[out], names[out] = out, types.bytes(out), 1
                live += size[out]
        scratch, estimated = _scratch(node, types, large, native)
        during = live
        now = tuple(sorted(((b, size[b]) for b, n in names.items() if n or b in pinned), key=lambda kv: -kv[1])[:2])
        pair = now if sum(b for _, b in now) > sum(b for _, b in pair) else pair
        for name in dead:
            buffer = owner.get(name)
            if buffer is not None:
                names[buffer] -= 1
                live -= size[buffer] if not names[buffer] and buffer not in pinned else 0
        steps.append(Step(index, node.name, node.op_type, held + during, scratch, held + live, estimated))
    return steps, pair
