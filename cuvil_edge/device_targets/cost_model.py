"""Cost model: predicted latency of a build, per node and per graph, from the target spec.

Each node is mapped to the kernel the target's build actually runs (the branches of ``k_conv``,
``k_mat_mul``, ``k_fused_mat_mul``, ``k_gemm``, the native C kernels), and costed as

    seconds = overhead + max(compute, memory) + serial passes

* overhead: the fixed cost of one call of the node's kernel kind (``kernel_overhead_us[kind]``, else
  ``call_overhead_us * KIND_FACTORS[kind]``), plus ``numpy_call_us`` for every further numpy call
  the kernel makes (im2col blocks, depthwise taps, the bias add and activation of its epilogue, a
  normalisation's passes) and the "native" call cost for each further foreign call;
* compute: where the spec has measured per-kernel terms (``kernel_ns``, :mod:`cost_kernels`, from
  `cuvil-edge calibrate`'s micro-benchmarks on synthetic shapes): each sgemm as ``2mkn flop + mk +
  kn + mn + call`` ns (a one-row product as sgemv: per matrix element and call; the further
  products of one batched np.matmul, as numpy loops over a stack or broadcasts a weight over a
  batch, pay ``gemm_batch_call`` instead of the call), the native Softmax's scalar remainder of
  rows off the SIMD width, the native depthwise convolution per plane, padded element and tap (the
  flat stride-1 path and the strided row loop apart) and the native max pooling likewise (its own
  terms), the native LayerNorm per element
  and row, numpy reductions per element and output. Else the roofline: a GEMM's FLOPs over
  ``peak_gflops[dtype] * gemm_efficiency * f(m) f(k) f(n)`` with ``f(d) = d / (d + gemm_half_dim)``,
  a native kernel's FLOPs over ``native_gflops`` plus ``native_plane_us`` per plane. Plus
  ``transcendental_ns`` per exp-class evaluation (Softmax, sigmoid, GELU, fused activations, LRN's
  power) and ``row_ns`` per row of a row-wise kernel;
* memory: bytes read + written + twice the scratch (each temporary is written, then read), at
  ``cache_bandwidth_gbs`` when they fit in ``cache_mb``, else ``memory_bandwidth_gbs *
  memory_efficiency``; a numpy kernel that loops over kernel taps passes over its output once per
  tap, a transpose's strided copy counts twice, a numpy normalisation makes one pass per step. A
  GEMM streams its operands during the product (at the plain copy bandwidth);
* serial passes, before or after a GEMM's product: its im2col copy (``kernel_ns["gather"]`` per
  element, else its traffic), its epilogue passes; and for any node, the pages of an array past the
  allocator's mmap limit, faulted in on every call (``kernel_ns["fresh_byte"]``).

The graph adds ``run_overhead_us`` once, and on an accelerator target the host<->device transfer of
the inputs and outputs (``transfer_bandwidth_gbs``, ``transfer_latency_us`` per direction and
chunk). The FLOPs are :func:`cuvil_edge.ir.cost.node_flops`; the scratch and the peak memory are the
build's memory plan (:func:`memory_plan.plan_memory`). ``bench/bench_cost_model.py`` validates the
model against measured latency on a calibrated host (``cuvil-edge calibrate``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from cuvil_edge.device_targets.cost_int8 import INT8_KIND, int8_seconds, int8_work
from cuvil_edge.device_targets.cost_kernels import (
    MMAP_LIMIT,
    depthwise_ns,
    gemm_products_ns,
    max_pool_ns,
    softmax_tail_ns,
)
from cuvil_edge.device_targets.cost_work import Work, work_of
from cuvil_edge.device_targets.memory_plan import plan_memory
from cuvil_edge.device_targets.spec import PRECISIONS, TargetSpec, resolve
from cuvil_edge.errors import BuildError, CuvilError
from cuvil_edge.ir import cost, dims, dtypes
from cuvil_edge.ir.graph import Graph, Node, TensorType

Bound = Literal["compute", "memory", "overhead"]

#: kernel_overhead_us key of the cost of each tap of the numpy window loop (else numpy_call_us)
WINDOW_TAP = "numpy window tap"
#: kernel_overhead_us key of one np.pad call (its Python-level argument handling: ~25x a ufunc)
NUMPY_PAD = "numpy pad"
#: Fixed cost of one call per kernel kind, as a multiple of call_overhead_us (a small elementwise
#: node), for the kinds a spec's kernel_overhead_us does not list. Measured by calibrate on this
#: repo's host (bench/results/cost_model.json, "kernel_overhead_us" over "call_overhead_us"): the
#: numpy conv paths build window views, transpose and reshape; a native kernel is a ctypes call
#: with a dozen arguments; normalisations compute statistics in several calls.
KIND_FACTORS: dict[str, float] = {
    "conv im2col": 12.5,
    "conv im2col blocks": 12.5,
    "conv per-tap gemm": 12.5,
    "conv depthwise taps": 12.5,
    "conv-transpose gemm": 12.5,
    "conv depthwise native": 9.0,
    "conv native gemm": 9.0,
    "conv 1x1 gemm": 4.7,
    "gemm": 1.0,
    "gemm rows collapsed": 1.6,
    "gemm batched": 1.5,
    "native": 2.7,
    "native layer norm": 6.5,
    "numpy window taps": 12.0,
    "normalization": 8.0,
    "gather": 3.0,
    "reduce": 5.0,
    "transpose": 1.5,
    "elementwise": 1.0,
    "view": 0.7,
}


@dataclass(frozen=True)
class NodeCost:
    """One node's predicted cost over the whole batch (every chunk on a static-batch target)."""

    node: str
    op_type: str
    kernel: str  # the kernel path the build runs, e.g. "conv im2col blocks", "gemm", "native", "elementwise"
    flops: int
    bytes_read: int  # inputs, weights included (a view op reads nothing)
    bytes_written: int  # outputs
    scratch_bytes: int  # the kernel's temporaries (im2col copies, padded planes), from the memory plan
    gemm: tuple[tuple[int, int, int, int], ...]  # (m, k, n, count) of each product it makes
    overhead_s: float
    compute_s: float
    memory_s: float
    seconds: float
    bound: Bound


@dataclass(frozen=True)
class CostPrediction:
    """Predicted latency of one run of ``graph`` on ``target``; ``seconds`` is the graph total."""

    graph: str
    target: str
    precision: str
    batch: int
    chunks: int  # runs of the module per call: static-batch targets split the batch
    nodes: tuple[NodeCost, ...]
    run_overhead_s: float
    transfer_bytes: int  # inputs in + outputs out (accelerator targets; 0 on a CPU)
    transfer_s: float
    peak_memory_bytes: int  # the build's memory plan

    @property
    def seconds(self) -> float:
        """The graph total: the nodes, the run's own overhead, and the host<->device transfers."""
        return sum(n.seconds for n in self.nodes) + self.run_overhead_s + self.transfer_s

    @property
    def flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, the nodes as dicts, and the totals."""
        return {**asdict(self), "seconds": self.seconds, "flops": self.flops}

    def describe(self, top: int = 10) -> str:
        """A few lines for a report: the total and the ``top`` costliest nodes."""
        lines = [
            f"{self.graph!r} on {self.target} ({self.precision}, batch {self.batch}): predicted "
            f"{self.seconds * 1e3:.3f} ms = nodes {sum(n.seconds for n in self.nodes) * 1e3:.3f} + run "
            f"{self.run_overhead_s * 1e3:.3f} + transfer {self.transfer_s * 1e3:.3f} ms; peak memory "
            f"{self.peak_memory_bytes / 2**20:.2f} MiB"
        ]
        for n in sorted(self.nodes, key=lambda n: -n.seconds)[:top]:
            lines.append(f"  {n.seconds * 1e3:9.3f} ms  {n.bound:<8} {n.kernel:<24} {n.op_type} {n.node!r}")
        return "\n".join(lines)


def predict(graph: Graph, target: TargetSpec | str, *, precision: str = "fp32", batch: int = 1) -> CostPrediction:
    """Predict the latency of ``graph`` built for ``target`` and run on ``batch`` samples.

    Raises:
        UnknownTargetError, TargetSpecError: ``target`` names no valid spec.
        TargetError: the target does not support ``precision``.
        BuildError: ``batch`` is not a positive int (or not 1 for a graph without a batch dim), a
            value keeps a symbolic dim other than the batch, or a node cannot be costed.
    """
    spec = resolve(target)
    caps = spec.capabilities(precision)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise BuildError(f"batch must be a positive int, got {batch!r}; pass the number of samples per run")
    native = spec.native_kernels  # the device builds its C kernels (the plan of the device, not of this host)
    plan = plan_memory(graph, spec, precision=precision, batch=batch, native=native)
    symbol = _batch_symbol(graph)
    step = spec.static_batch if spec.static_shapes and symbol else batch
    chunks = -(-batch // step)
    bindings = {symbol: step} if symbol else {}
    flops = cost.node_flops(graph, bindings)
    scratch = {s.node: s.scratch_bytes for s in plan.steps}
    fp16, large = bool(caps["COMPUTE_FP16"]), bool(caps["TARGET_LARGE_SCRATCH"])
    dtype = PRECISIONS[precision]
    peak = spec.peak_gflops.get(dtype) or spec.peak_gflops.get("float32") or max(spec.peak_gflops.values())
    rows = []
    for node in graph.nodes:
        ins = tuple(_bound(graph, i, bindings, fp16) if i else None for i in node.inputs)
        outs = tuple(_bound(graph, o, bindings, fp16) if o else None for o in node.outputs)
        try:
            work = int8_work(node, ins, outs, caps) or work_of(node, ins, outs, large=large, native=native)
        except CuvilError:
            raise
        except Exception as e:  # a node this model cannot read must name itself
            raise BuildError(f"cost model of {node.describe()} failed: {type(e).__name__}: {e}") from e
        rows.append(_cost(spec, node, ins, outs, work, flops[node.name], scratch.get(node.name, 0), peak, chunks))
    transfer_bytes, transfer_s = 0, 0.0
    if spec.accelerator != "none":
        full = {symbol: batch} if symbol else {}
        transfer_bytes = sum(_bytes(v.type.bind(full)) for v in (*graph.inputs, *graph.outputs))
        bandwidth = spec.transfer_bandwidth_gbs or spec.memory_bandwidth_gbs
        transfer_s = transfer_bytes / (bandwidth * 1e9) + 2 * chunks * spec.transfer_latency_us * 1e-6
    return CostPrediction(
        graph.name,
        spec.name,
        precision,
        batch,
        chunks,
        tuple(rows),
        spec.run_overhead_us * 1e-6 * chunks,
        transfer_bytes,
        transfer_s,
        plan.peak_bytes,
    )


def gemm_efficiency(spec: TargetSpec, m: int, k: int, n: int) -> float:
    """Fraction of peak a product of these dims reaches: each small dim costs d / (d + half)."""
    h = spec.gemm_half_dim
    return spec.gemm_efficiency * (m / (m + h)) * (k / (k + h)) * (n / (n + h))


def kernel_overhead_us(spec: TargetSpec, kind: str) -> float:
    """Fixed µs of one call of a ``kind`` kernel on ``spec``: the spec's own figure, else
    call_overhead_us scaled by :data:`KIND_FACTORS`."""
    if kind in spec.kernel_overhead_us:
        return spec.kernel_overhead_us[kind]
    return spec.call_overhead_us * KIND_FACTORS.get(kind, 1.0)


def _cost(
    spec: TargetSpec, node: Node, ins, outs, work: Work, flops: int, scratch: int, peak: float, chunks: int
) -> NodeCost:
    view = work.kernel == "view"
    read = (
        0
        if view
        else sum(_bytes(t) for t in {i: t for i, t in zip(node.inputs, ins, strict=True) if t is not None}.values())
    )
    written = 0 if view else sum(_bytes(t) for t in outs)
    fits = spec.cache_bandwidth_gbs is not None and read + written + scratch <= spec.cache_mb * 2**20
    cache_gbs = spec.cache_bandwidth_gbs
    bandwidth = 1e9 * (
        cache_gbs if fits and cache_gbs is not None else spec.memory_bandwidth_gbs * spec.memory_efficiency
    )
    # BLAS streams its operands in packed panels (no numpy temporaries, no fresh pages per pass):
    # the plain copy bandwidth, or the cache's when they fit
    operands = 1e9 * (cache_gbs if fits and cache_gbs is not None else spec.memory_bandwidth_gbs)
    # a GEMM streams its operands while it computes; its im2col copies and epilogue passes come
    # before or after the product, so they add to it rather than overlap
    terms = spec.kernel_ns
    gather = terms.get("gather_strided" if work.strided else "gather", terms.get("gather"))
    # an im2col copy at the measured strided-copy rate (its scratch is then the columns, written once)
    copied = work.gathered * gather * 1e-9 if gather is not None and work.gathered else None
    columns = 0 if copied is None else work.gathered * _item(ins[0])  # blocks: in traffic; whole: in scratch
    blocked = work.kernel == "conv im2col blocks"
    extra = work.traffic - 2 * columns if blocked else work.traffic
    scratch_traffic = 2 * scratch if blocked else 2 * max(0, scratch - columns)
    streamed = (read + written) / operands if work.gemm else (read + written + scratch_traffic + extra) / bandwidth
    serial = (scratch_traffic + extra) / bandwidth if work.gemm else 0.0
    serial += copied or 0.0
    # arrays past the allocator's mmap limit fault their pages in on every call
    fresh = sum(_bytes(t) for t in outs if _bytes(t) >= MMAP_LIMIT) + (scratch if scratch >= MMAP_LIMIT else 0)
    serial += fresh * terms.get("fresh_byte", 0.0) * 1e-9
    compute = int8_seconds(spec, work.gemm) if work.kernel == INT8_KIND else _compute_s(spec, work, flops, peak)
    # the numpy window loop's taps: a Python generator step, a strided view and a ufunc each
    taps = work.kernel == "numpy window taps"
    per_call = spec.kernel_overhead_us.get(WINDOW_TAP, spec.numpy_call_us) if taps else spec.numpy_call_us
    overhead = (
        kernel_overhead_us(spec, work.kernel)
        + work.calls * per_call
        + work.pad_calls * spec.numpy_call_us
        + work.np_pads * spec.kernel_overhead_us.get(NUMPY_PAD, 0.0)
        + work.native_calls * kernel_overhead_us(spec, "native")
    ) * 1e-6
    memory = streamed + serial
    parts: dict[Literal["overhead", "compute", "memory"], float] = {
        "overhead": overhead,
        "compute": compute,
        "memory": memory,
    }
    seconds = (overhead + max(compute, streamed) + serial) * chunks
    return NodeCost(
        node.name,
        node.op_type,
        work.kernel,
        flops * chunks,
        read * chunks,
        written * chunks,
        scratch,
        work.gemm,
        overhead * chunks,
        compute * chunks,
        memory * chunks,
        seconds,
        max(parts, key=parts.__getitem__),
    )


def _compute_s(spec: TargetSpec, work: Work, flops: int, peak: float) -> float:
    """The arithmetic: a GEMM's products (the measured sgemm terms, else the roofline), the native
    kernels (measured per-kernel terms, else native_gflops), reductions, exp-class functions, rows."""
    terms = spec.kernel_ns
    measured = [gemm_products_ns(terms, m, k, n, count, work.products) for m, k, n, count in work.gemm]
    rows = work.rows * spec.row_ns * (3 if work.reduced else 1)  # numpy's reduction loop: ~3x a native row's
    known = [t for t in measured if t is not None]
    compute: float
    if work.gemm and len(known) == len(measured):
        # the fitted sgemm terms include packing the operands (from L3, as calibrated)
        compute = sum(known)  # a batched call's further products skip numpy's call setup
    elif work.gemm:
        compute = sum(count * 2.0 * m * k * n / (peak * gemm_efficiency(spec, m, k, n)) for m, k, n, count in work.gemm)
    elif work.layer_norm and "ln_element" in terms:  # the native LayerNorm's passes and rows, measured
        compute, rows = work.layer_norm * terms["ln_element"] + work.rows * terms.get("ln_row", 0.0), 0.0
    elif work.native:
        dw = depthwise_ns(terms, *work.depthwise) if work.depthwise else None
        if work.pool and work.depthwise:  # compare-and-select over the same padded plane and row loop
            dw = max_pool_ns(terms, *work.depthwise[:4]) or dw
        rate = spec.native_gflops or spec.peak_gflops.get("float32", peak) / 8
        compute = flops / rate + work.planes * spec.native_plane_us * 1e3 if dw is None else dw
    else:
        compute = 0.0  # numpy's elementwise passes: the memory term covers them
    if work.reduced and "reduce_element" in terms:  # numpy's reduction loop, measured per element and output
        rows = work.reduced * terms["reduce_element"] + work.rows * terms.get("reduce_row", 0.0)
    # the native Softmax's scalar remainder per row (its width past a multiple of the float32 lanes)
    tail = softmax_tail_ns(terms, work.rows, work.width, spec.simd_bits // 32) if work.width else 0.0
    return (compute + rows + tail + work.exp_elements * spec.transcendental_ns) * 1e-9


def _bytes(t: TensorType | None) -> int:
    return 0 if t is None else t.numel() * dtypes.itemsize(t.dtype)


def _item(t: TensorType) -> int:
    return 4 if t.dtype == "float16" else dtypes.itemsize(t.dtype)  # float16 is computed in float32


def _bound(graph: Graph, name: str, bindings: dict[str, int], fp16: bool) -> TensorType:
    """The value's runtime type: the batch bound, float32 stored as float16 in a float16 build."""
    t = graph.types[name].bind(bindings)
    return TensorType("float16", t.shape) if fp16 and t.dtype == "float32" else t


def _batch_symbol(graph: Graph) -> str | None:
    """The one symbol the inputs lead with (plan_memory has already refused several)."""
    leading = {
        s
        for v in graph.inputs
        if v.type.shape and isinstance(v.type.shape[0], str)
        for s in dims.symbols_of(v.type.shape[0])
    }
    return leading.pop() if len(leading) == 1 else None
