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

import math
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
from cuvil_edge.device_targets.memory_plan import VIEW_OPS, plan_memory
from cuvil_edge.device_targets.spec import PRECISIONS, TargetSpec, resolve
from cuvil_edge.errors import BuildError, CuvilError
from cuvil_edge.ir import cost, dims, dtypes, ops
from cuvil_edge.ir.graph import Graph, Node, TensorType
from cuvil_edge.ir.ops._conv_path import conv_path, im2col_block_rows

Bound = Literal["compute", "memory", "overhead"]

#: Ops with a native C path (float32), besides depthwise conv: elementwise maps, Softmax, LayerNorm.
NATIVE_OPS = frozenset({"Erf", "Gelu", "Sigmoid", "Swish", "Softmax", "LayerNormalization", "MaxPool"})
#: GEMM-like ops and the kernel family that costs them.
CONV_OPS = frozenset({"Conv", "CuvilFusedConv", "CuvilConvAdd"})
MATMUL_OPS = frozenset({"MatMul", "CuvilFusedMatMul", "Gemm", "CuvilFusedGemm", "ConvTranspose"})
#: numpy kernels that loop over window taps, each a pass over the output (when not native).
TAP_OPS = frozenset({"MaxPool", "AveragePool"})
#: numpy kernels making several passes and many small calls (statistics, casts, broadcasts).
NORMALIZATION_OPS = frozenset(
    {
        "InstanceNormalization",
        "BatchNormalization",
        "LRN",
        "LayerNormalization",
        "GroupNormalization",
        "MeanVarianceNormalization",
    }
)
#: index and broadcast kernels: index normalisation (np.where), then a take or a broadcast copy.
GATHER_OPS = frozenset({"Gather", "GatherElements", "GatherND", "Expand", "Tile", "ScatterND"})
#: Ops (and fused activations) that evaluate an exp-class function per element: transcendental_ns each
#: (with every op whose OpDef declares it: its ``transcendental`` facet).
TRANSCENDENTAL_OPS = frozenset(
    {
        "Softmax",
        "LogSoftmax",
        "Swish",
    }
)
TRANSCENDENTAL_ACTIVATIONS = frozenset({"sigmoid", "swish", "gelu", "tanh"})
#: Reductions over axes (means, sums, maxima): numpy's reduction machinery and a keepdims reshape.
REDUCE_OPS = frozenset(
    {
        "GlobalAveragePool",
        "GlobalMaxPool",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL2",
        "ReduceSumSquare",
        "ArgMax",
        "ArgMin",
    }
)
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


@dataclass(frozen=True)
class _Work:
    """What a kernel does: its products, Python-loop calls, memory traffic and native FLOPs."""

    kernel: str
    gemm: tuple[tuple[int, int, int, int], ...] = ()
    calls: int = 0  # numpy calls in Python loops beyond the first
    traffic: int = 0  # bytes moved beyond read + written + 2 x scratch (repeated passes)
    native: bool = False  # its arithmetic runs in the C kernels at native_gflops
    planes: int = 0  # image planes a native kernel pads and loops over, native_plane_us each
    exp_elements: int = 0  # exp-class function evaluations, transcendental_ns each
    rows: int = 0  # rows of a row-wise kernel (softmax rows, reduction outputs), row_ns each
    gathered: int = 0  # elements a window copy (im2col) moves, kernel_ns["gather"] each
    strided: bool = False  # the convolution has a stride > 1: kernel_ns["gather_strided"] per element
    native_calls: int = 0  # foreign calls beyond the first (an epilogue's activation), "native" overhead each
    reduced: int = 0  # input elements a numpy reduction reads, kernel_ns["reduce_element"] each
    layer_norm: int = 0  # elements the native LayerNorm normalises, kernel_ns["ln_element"] each
    depthwise: tuple | None = None  # native depthwise: (planes, (ph, pw), (oh, ow), taps, strided)
    products: int = 0  # np.matmul calls making the products (a batched call makes several); 0: one each
    pad_calls: int = 0  # numpy calls padding a window loop's input (np.full, the assignment), its counts' arrays
    np_pads: int = 0  # np.pad calls (AveragePool's count_include_pad window counts), kernel_overhead_us[NUMPY_PAD] each
    width: int = 0  # a native Softmax's row length (its remainder past the SIMD width runs scalar)
    pool: bool = False  # the native max pooling (its own measured terms, else the depthwise kernel's)


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
            work = int8_work(node, ins, outs, caps) or _work(node, ins, outs, large, native)
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
    spec: TargetSpec, node: Node, ins, outs, work: _Work, flops: int, scratch: int, peak: float, chunks: int
) -> NodeCost:
    view = node.op_type in VIEW_OPS
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


def _compute_s(spec: TargetSpec, work: _Work, flops: int, peak: float) -> float:
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


def _work(node: Node, ins, outs, large: bool, native: bool) -> _Work:
    """The kernel path ``node`` takes on the target, mirroring the kernels' branches."""
    op = node.op_type
    if op in CONV_OPS:
        return _conv(node, ins, outs, large, native)
    if op in MATMUL_OPS:
        return _matmul(node, ins, outs, native)
    if op in VIEW_OPS:
        return _Work("view")
    fp32 = ins and ins[0] is not None and ins[0].dtype == "float32"
    exp = outs[0].numel() if _transcendental(op) and outs and outs[0] is not None else 0
    if op in NATIVE_OPS and native and fp32 and (op != "MaxPool" or ins[0].rank == 4):
        if op == "MaxPool":  # the strided depthwise kernel's loop: a padded plane, every tap per output row
            attrs = ops.get(op, node.describe()).attrs(node)
            kernel, out = tuple(attrs["kernel_shape"]), tuple(outs[0].shape[2:])
            st, di = attrs.get("strides") or (1,) * len(kernel), attrs.get("dilations") or (1,) * len(kernel)
            padded_plane = tuple((o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out, st, di, kernel, strict=True))
            planes = math.prod(ins[0].shape[:2])
            return _Work(
                "native",
                native=True,
                planes=planes,
                pool=True,
                depthwise=(planes, padded_plane, out, math.prod(kernel), True) if len(out) == 2 else None,
            )
        if op == "LayerNormalization":  # the C kernel's three passes per row, measured (kernel_ns ln_*)
            # its own kind: four arrays passed (x, scale, bias, y), each pointer read through .ctypes
            return _Work("native layer norm", native=True, rows=_rows(node, ins[0]), layer_norm=ins[0].numel())
        rows = _rows(node, ins[0])
        width = ins[0].numel() // max(rows, 1) if op == "Softmax" else 0
        return _Work("native", native=True, exp_elements=exp, rows=rows, width=width)
    if op in NORMALIZATION_OPS:  # numpy's passes: each reads its operands and writes a new array
        passes, reductions, powers = _normalization_passes(node)
        size = _bytes(ins[0])
        return _Work(
            "normalization",
            calls=passes + reductions,
            traffic=3 * passes * size,
            reduced=reductions * ins[0].numel(),
            exp_elements=powers * ins[0].numel(),
        )
    if op in GATHER_OPS:
        return _Work("gather")
    if op in REDUCE_OPS:
        # numpy's reduction sets up its inner loop per output element (GlobalAveragePool over
        # 1280 x 7 x 7: 87 ns per row, vs 29 for native Softmax rows: row_ns x 3 without reduce_row)
        return _Work("reduce", rows=outs[0].numel(), reduced=ins[0].numel())
    if op == "Transpose":  # a strided copy: each element read from a different cache line
        return _Work("transpose", traffic=2 * _bytes(outs[0]))
    if op in TAP_OPS:  # per tap a strided view and a ufunc pass; a padded input is first copied (np.full, assign)
        attrs = ops.get(op, node.describe()).attrs(node)
        taps = math.prod(attrs["kernel_shape"])
        padded = any(attrs.get("pads") or ()) or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
        traffic = 2 * taps * _bytes(outs[0]) + 3 * padded * _bytes(ins[0])
        if op == "AveragePool":  # and a second tap loop counting each window's cells, then the division
            include = bool(attrs.get("count_include_pad", 0))
            return _Work(
                "numpy window taps",
                calls=2 * taps,
                traffic=traffic + 3 * _bytes(outs[0]),
                pad_calls=4 * padded + 4,
                np_pads=int(include),
            )
        return _Work("numpy window taps", calls=taps, traffic=traffic, pad_calls=2 * padded)
    return _Work("elementwise", exp_elements=exp)


def _conv(node: Node, ins, outs, large: bool, native: bool) -> _Work:
    """k_conv's branches, by :func:`conv_path`: native depthwise, native GEMM, 1x1 matmul, im2col
    whole or in blocks, numpy depthwise per tap, low-memory per-tap products; then the epilogue."""
    attrs = ops.get(node.op_type, node.describe()).attrs(node)
    x, w, y = ins[0], ins[1], outs[0]
    n, c, m, kernel = x.shape[0], x.shape[1], w.shape[0], tuple(w.shape[2:])
    group, k, taps = int(attrs.get("group", 1)), len(kernel), math.prod(w.shape[2:])
    cg, mg, out = c // group, m // group, tuple(y.shape[2:])
    p, item = math.prod(out), 4 if x.dtype == "float16" else dtypes.itemsize(x.dtype)
    y_bytes = n * m * p * item
    padded = bool(any(attrs.get("pads") or ())) or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
    act = str(attrs.get("activation", "none"))
    exp = n * m * p if act in TRANSCENDENTAL_ACTIVATIONS else 0
    bias = len(ins) > 2 and ins[2] is not None
    epilogue = 2 * y_bytes * ((bias + (act != "none")) if not native or y.numel() < 1 << 15 else 1)
    calls, foreign = _epilogue_calls(bias, act, native and x.dtype != "float16", y.numel())
    strided = any(s != 1 for s in attrs.get("strides") or ())
    path = conv_path(
        k, c, m, group, max(kernel, default=1) == 1, padded, native and x.dtype == "float32", large, c * taps * p * item
    )
    if path == "native depthwise":
        st, di = attrs.get("strides") or (1, 1), attrs.get("dilations") or (1, 1)
        padded_plane = tuple((o - 1) * s + d * (kk - 1) + 1 for o, s, d, kk in zip(out, st, di, kernel, strict=True))
        # bias and Relu/Clip inside the C kernel; sigmoid/swish/GELU one more foreign call
        return _Work(
            "conv depthwise native",
            native=True,
            planes=n * c,
            exp_elements=exp,
            depthwise=(n * c, padded_plane, out, taps, tuple(st) != (1, 1)),
            native_calls=int(act in TRANSCENDENTAL_ACTIVATIONS),
            calls=4 * (act == "hardswish"),
        )
    if path == "native gemm":  # im2col packing, bias and Relu/Clip in the C GEMM: costed as the sgemm
        return _Work(
            "conv native gemm",
            ((m, c * taps, p, n),),
            exp_elements=exp,
            products=n,
            native_calls=int(act in TRANSCENDENTAL_ACTIVATIONS),
            calls=4 * (act == "hardswish"),
        )
    if path == "1x1 matmul":
        # a strided 1x1 reads every s-th pixel: the reshape copies that view (a strided gather)
        return _Work(
            "conv 1x1 gemm",
            ((mg, cg, p, n * group),),
            traffic=epilogue,
            exp_elements=exp,
            calls=calls,
            native_calls=foreign,
            gathered=n * c * p if strided else 0,
            strided=strided,
            products=1,
        )
    if path == "depthwise taps":  # y += window * w per tap: the product written, then y read and written
        return _Work(
            "conv depthwise taps",
            calls=2 * taps + calls,
            traffic=4 * taps * y_bytes + epilogue,
            exp_elements=exp,
            native_calls=foreign,
        )
    if path == "im2col blocks":  # each block's strided gather is one more read and write of its columns
        rows = im2col_block_rows(out[0], c * taps * out[1] * item)
        blocks = n * -(-out[0] // rows)
        return _Work(
            "conv im2col blocks",
            ((m, c * taps, rows * out[1], blocks),),
            calls=2 * blocks + calls,
            traffic=2 * n * c * taps * p * item + epilogue,
            exp_elements=exp,
            gathered=n * c * taps * p,
            native_calls=foreign,
            strided=strided,
        )
    if path == "im2col":
        return _Work(
            "conv im2col",
            ((mg, cg * taps, p, n * group),),
            traffic=epilogue,
            exp_elements=exp,
            gathered=n * c * taps * p,
            calls=calls,
            native_calls=foreign,
            strided=strided,
            products=1,
        )
    return _Work(
        "conv per-tap gemm",
        ((mg, cg, p, n * group * taps),),
        calls=2 * taps + calls,
        traffic=2 * taps * y_bytes + epilogue,
        exp_elements=exp,
        native_calls=foreign,
        products=taps,
    )


def _matmul(node: Node, ins, outs, native: bool) -> _Work:
    """k_mat_mul (one product over collapsed rows when b is 2-D, else numpy's batched loop),
    k_fused_mat_mul (collapsed rows), k_gemm, k_conv_transpose (one product per tap)."""
    a, b, y = ins[0], ins[1], outs[0]
    op = node.op_type
    act = str(ops.get(op, node.describe()).attrs(node).get("activation", "none")) if op.startswith("Cuvil") else ""
    exp = y.numel() if act in TRANSCENDENTAL_ACTIVATIONS else 0
    if op == "ConvTranspose":
        taps, group = math.prod(b.shape[2:]), int(node.attr("group", 1) or 1)
        return _Work(
            "conv-transpose gemm",
            ((b.shape[1], b.shape[0] // group, math.prod(a.shape[2:]), a.shape[0] * group * taps),),
            calls=taps,
        )
    bias = len(ins) > 2 and ins[2] is not None
    if op in ("Gemm", "CuvilFusedGemm"):
        m, k = reversed(a.shape) if node.attr("transA", 0) else a.shape
        n = b.shape[0] if node.attr("transB", 0) else b.shape[1]
        calls, foreign = _epilogue_calls(bias, act or "none", False, y.numel())
        return _Work(
            "gemm", ((m, k, n, 1),), traffic=2 * _bytes(y) * bias, exp_elements=exp, calls=calls, native_calls=foreign
        )
    if b.rank == 2 and (a.rank > 2 or op == "CuvilFusedMatMul"):
        rows = math.prod(a.shape[:-1])
        fused = op == "CuvilFusedMatMul"
        epilogue = 2 * _bytes(y) if fused and bias else 0
        calls, foreign = _epilogue_calls(bias and fused, act or "none", native and y.dtype == "float32", y.numel())
        return _Work(
            "gemm rows collapsed",
            ((rows, a.shape[-1], b.shape[-1], 1),),
            traffic=epilogue,
            exp_elements=exp,
            calls=calls,
            native_calls=foreign,
        )
    m = a.shape[-2] if a.rank > 1 else 1
    n = b.shape[-1] if b.rank > 1 else 1
    count = math.prod(y.shape[:-2]) if y.rank > 2 else 1
    return _Work("gemm batched" if count > 1 else "gemm", ((m, a.shape[-1], n, count),), products=1)


def _normalization_passes(node: Node) -> tuple[int, int, int]:
    """(elementwise passes, reductions, exp-class evaluations per element) of the numpy kernel of a
    normalisation op (normalization.py): statistics by reductions, then centring, scaling, the affine
    terms and the final astype as separate passes; LRN's window is one pass per channel tap and its
    power a log and an exp."""
    op = node.op_type
    if op == "LRN":
        return 6 + int(node.attr("size", 5) or 5), 0, 2
    if op == "BatchNormalization":
        return 4, 0, 0
    return 7, 2, 0  # Instance/Group/LayerNormalization (numpy path), MeanVarianceNormalization


def _epilogue_calls(bias: bool, act: str, native: bool, size: int) -> tuple[int, int]:
    """(numpy calls, foreign calls) of a kernel's bias and activation epilogue: one native pass
    from 32k outputs, else an in-place add, Relu/Clip as one ufunc, sigmoid/swish/GELU as a
    foreign map (numpy's several passes without the native library), HardSwish in numpy."""
    if not bias and act == "none":
        return 0, 0
    if native and size >= 1 << 15 and act != "hardswish":
        return 0, 1
    calls = int(bias) + {"none": 0, "relu": 1, "relu6": 1, "hardswish": 4}.get(act, 0 if native else 5)
    return calls, int(native and act in TRANSCENDENTAL_ACTIVATIONS)


def _transcendental(op_type: str) -> bool:
    """Whether ``op_type`` evaluates an exp-class function per element: listed here, or declared by
    its OpDef (the ``transcendental`` facet, read at each call)."""
    declared = ops.registry().get(op_type)
    return op_type in TRANSCENDENTAL_OPS or (declared is not None and declared.transcendental)


def _rows(node: Node, x: TensorType) -> int:
    """Rows a row-wise kernel loops over: the elements before its (last, or given) axis."""
    axis = int(node.attr("axis", -1) or -1) if node.op_type != "Softmax" or node.attr("axis", -1) is not None else -1
    axis = axis % x.rank if x.rank else 0
    # int(): a symbolic dim raises rather than multiplying as a string
    shape = tuple(int(d) for d in x.shape)
    return math.prod(shape[:axis]) if node.op_type == "LayerNormalization" else x.numel() // max(shape[-1], 1)


def _item(t: TensorType) -> int:
    return 4 if t.dtype == "float16" else dtypes.itemsize(t.dtype)  # float16 is computed in float32


def _bytes(t: TensorType | None) -> int:
    return 0 if t is None else t.numel() * dtypes.itemsize(t.dtype)


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
