"""Calibration: measure this host and write a target spec for it.

`cuvil-edge calibrate` times, on one thread (BLAS held to one thread with threadpoolctl, as the
benchmarks run): the per-kernel terms of :mod:`cost_kernels` on synthetic shapes (sgemm over a
log-uniform grid of shapes, the native depthwise and LayerNorm kernels, im2col copies, numpy
reductions, fresh pages), a large copy (memory bandwidth) and a small one (cache bandwidth), numpy's
add against that copy (memory efficiency), one small numpy call, and compiled modules built for
the spec being written: a chain of tiny nodes (per-node and per-run overhead) and a depthwise
convolution (the native C kernels' rate). The result is a full :class:`TargetSpec` based on
``--base`` with the measured fields replaced, so :func:`cost_model.predict` for this host can be
checked against measurement (bench/bench_cost_model.py).

OpenBLAS reads ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` when numpy loads; a process cannot
change that afterwards, so the calibration records whether they were set (they can halve sgemm
speed; the spec then describes the host as configured).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import ValidationError

from cuvil_edge.atomic import atomic_write
from cuvil_edge.device_targets import calibrate_probes as probe_graphs, cost_kernels
from cuvil_edge.device_targets.cost_kernels import fit_gemm
from cuvil_edge.device_targets.cost_model import NUMPY_PAD, WINDOW_TAP
from cuvil_edge.device_targets.spec import TargetSpec, load_target
from cuvil_edge.errors import TargetSpecError
from cuvil_edge.extras import require
from cuvil_edge.ir.ops._contract import Probe

logger = logging.getLogger(__name__)

#: Environment variables OpenBLAS reads at load time that change its kernels.
OPENBLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

#: (m, k, n) of the sgemm that gives peak_gflops (the per-shape terms are cost_kernels' synthetic grid).
GEMM_SHAPES = ((1024, 1024, 1024),)


@dataclass(frozen=True)
class Calibration:
    """The spec written for this host, what was measured, and how."""

    spec: TargetSpec
    base: str
    measured: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    def to_yaml(self) -> str:
        """The spec as YAML, with a comment header saying when, where and how it was measured."""
        env = self.environment
        header = [
            f"# {self.spec.name}: measured by `cuvil-edge calibrate --base {self.base}` on {env['date']}",
            f"# machine: {env['cpu']} ({env['cores']} cores), Python {env['python']}, numpy {env['numpy']}",
            f"# one thread (BLAS limited to 1 with threadpoolctl: {env['threads_limited']}), CPU time; "
            f"OpenBLAS env at numpy load: {env['openblas_env']}",
            f"# peak_gflops.float32: the fastest of {len(self.measured['sgemm_gflops'])} sgemm shapes "
            f"({self.measured['sgemm_best_gflops']:.1f} GFLOP/s); gemm_efficiency/gemm_half_dim fitted to them",
            "# kernel_ns: per-kernel terms fitted to synthetic shapes (cost_kernels.py): sgemm flop/packing/call,",
            "#   batched products, native depthwise per plane/pad/tap (stride 1, strided), native LayerNorm and",
            "#   Softmax's scalar row remainder, reductions, im2col",
            "#   copies (stride 1, strided), fresh pages past the mmap limit; operands cycled out of L2",
            "# memory_bandwidth_gbs: np.copyto of 128 MiB (32 with --quick), read + write; memory_efficiency: a + b",
            "#   of 16 MiB (a new array, as kernels write) over that; cache_bandwidth_gbs: a + b of 512 KiB cycled",
            "#   through 16 copies (operands out of L2, as in a model)",
            "# call/run overhead: compiled modules of 6 and 66 small nodes (Add, Mul, Reshape, Transpose, Relu),",
            "#   the run at least run() around the generated _forward;",
            "#   native_gflops / native_plane_us: compiled depthwise 3x3 convs of 32 x 56 x 56 and 512 x 7 x 7;",
            "#   kernel_overhead_us: per kernel kind, a module of 8 chained calls on small tensors; these and",
            f"#   call_overhead_us x {self.measured['cold_scale']:.2f}, the slow-down of the same calls interleaved;",
            "#   transcendental_ns / row_ns: Softmax over (64, 1024) / (4096, 16) beyond its call and memory time",
            "#   other fields, and other dtypes' peaks (scaled), from the base spec",
        ]
        body = yaml.safe_dump(self.spec.model_dump(mode="json"), sort_keys=False)
        return "\n".join(header) + "\n" + body


def calibrate(
    base: str = "x86-64", *, name: str = "host", quick: bool = False, specs_dir: Path | str | None = None
) -> Calibration:
    """Measure this host and return a spec named ``name`` based on the spec ``base``.

    ``quick``: fewer and shorter repeats (seconds instead of ~15 s; for tests, noisier).

    Raises:
        UnknownTargetError, TargetSpecError: ``base`` names no valid spec, or the measured spec
            does not validate (the message names the field).
    """
    require(("onnx",), "calibrating builds its probe models with onnx", "coordinator")
    reference = load_target(base, specs_dir=specs_dir)
    budget = 0.02 if quick else 0.08  # CPU seconds of timing per measurement (the fastest sample counts)
    with _one_thread() as limited:
        # the kernels' own terms (cost_kernels.py), on synthetic shapes
        kernel_ns, rates = cost_kernels.measure_gemm(budget / 6, quick)
        kernel_ns.update(cost_kernels.measure_gemm_batched(kernel_ns, budget / 6))
        kernel_ns.update(cost_kernels.measure_gemv(budget / 6))
        kernel_ns.update(cost_kernels.measure_depthwise(budget / 6))
        kernel_ns.update(cost_kernels.measure_max_pool(budget / 6))
        kernel_ns.update(cost_kernels.measure_softmax_tail(budget / 6, reference.simd_bits // 32))
        kernel_ns.update(cost_kernels.measure_reduce(budget / 6))
        kernel_ns.update(cost_kernels.measure_layer_norm(budget / 6))
        kernel_ns.update(cost_kernels.measure_gather(budget / 4))
        kernel_ns["fresh_byte"] = cost_kernels.measure_fresh(budget / 2)
        sgemm: dict[tuple[int, int, int], float] = {}
        for s, g in rates.items():
            m, k, n = (int(d) for d in s.split("x"))
            sgemm[(m, k, n)] = g
        sgemm.update({shape: _gemm_gflops(*shape, budget / 4) for shape in GEMM_SHAPES[-1:]})  # the peak
        copy_gbs = _copy_gbs(32 << 20 if quick else 128 << 20, budget)
        # kernels allocate their outputs: time a + b (new array) rather than an in-place add
        # 1.5 MiB moved, the working set of a mid-sized node, its operands last touched before other
        # layers ran (cycled through 8 MiB of copies, past L2)
        cache_gbs = _add_gbs(512 << 10, budget, copies=16)
        # past L2 but under the allocator's mmap limit: the fresh pages of bigger arrays are kernel_ns's
        add_gbs = _add_gbs(4 << 20 if quick else 16 << 20, budget)
        a = np.zeros(16, np.float32)  # allocated once, outside the timed call
        numpy_call_us = _time_per_call(lambda: np.add(a, a, out=a), budget) * 1e6
    best = max(sgemm.values())
    efficiency, half = fit_gemm(sgemm, best)
    draft = reference.model_copy(
        update={
            "name": name,
            "description": f"this host, measured ({platform.machine()}, one thread), based on {base}",
            "native_kernels": reference.native_kernels and cost_kernels._native_library() is not None,
            "peak_gflops": {
                d: round(best * v / reference.peak_gflops.get("float32", v), 2)
                for d, v in reference.peak_gflops.items()
            },
            "memory_bandwidth_gbs": round(copy_gbs, 2),
            "cache_bandwidth_gbs": round(cache_gbs, 2),
            "cache_mb": _cache_mb(),
            "memory_efficiency": round(min(1.0, max(0.05, add_gbs / copy_gbs)), 3),
            "gemm_efficiency": round(efficiency, 3),
            "gemm_half_dim": round(half, 2),
            "numpy_call_us": round(numpy_call_us, 3),
            "memory_mb": _memory_mb(reference.memory_mb),
            "kernel_ns": {k: round(v, 5 if v < 1 else 2) for k, v in sorted(kernel_ns.items())},
        }
    )
    with _one_thread():
        call_us, run_us, native, plane_us = _module_costs(draft, budget)
        update: dict[str, Any] = {"call_overhead_us": round(call_us, 3), "run_overhead_us": round(run_us, 3)}
        if native is not None and plane_us is not None:  # measured together
            update["native_gflops"], update["native_plane_us"] = round(native, 3), round(plane_us, 4)
        update["kernel_overhead_us"] = {
            WINDOW_TAP: _window_tap_us(draft.model_copy(update=update), budget),
            NUMPY_PAD: cost_kernels.measure_pad_us(budget),
        }
        kinds = {**update["kernel_overhead_us"], **_kind_overheads(draft.model_copy(update=update), budget)}
        update["kernel_overhead_us"] = kinds
        scale = _cold_scale(draft.model_copy(update=update), budget)
        update["transcendental_ns"] = round(_transcendental_ns(draft.model_copy(update=update), budget), 3)
        update["row_ns"] = round(_row_ns(draft.model_copy(update=update), budget), 3)
    update["kernel_overhead_us"] = {k: round(v * scale, 3) for k, v in sorted(kinds.items())}
    update["call_overhead_us"] = round(call_us * scale, 3)
    try:
        spec = TargetSpec.model_validate({**draft.model_dump(), **update})
    except ValidationError as e:
        raise TargetSpecError(
            f"the measured spec for {name!r} is invalid ({e}); is this host under heavy load? "
            "Run `cuvil-edge calibrate` again"
        ) from e
    measured = {
        "sgemm_gflops": {"x".join(map(str, s)): round(g, 2) for s, g in sgemm.items()},
        "sgemm_best_gflops": best,
        "copy_gbs": copy_gbs,
        "cache_copy_gbs": cache_gbs,
        "add_gbs": add_gbs,
        "numpy_call_us": numpy_call_us,
        "call_overhead_us": call_us,
        "run_overhead_us": run_us,
        "native_gflops": native,
        "native_plane_us": plane_us,
        "kernel_overhead_us": kinds,
        "cold_scale": scale,
        "kernel_ns": kernel_ns,
    }
    return Calibration(spec, base, measured, _environment(limited))


def write_spec(calibration: Calibration, path: Path | str) -> Path:
    """Write the calibrated spec to ``path`` (atomically); it must be named ``<spec name>.yaml``
    for :func:`load_target` to find it.

    Raises:
        TargetSpecError: ``path``'s file name does not match the spec name, or it cannot be written.
    """
    path = Path(path)
    if path.suffix != ".yaml" or path.stem != calibration.spec.name:
        raise TargetSpecError(
            f"a spec named {calibration.spec.name!r} must be written to "
            f"{calibration.spec.name}.yaml (got {path.name}); load_target finds it by name"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, calibration.to_yaml().encode("utf-8"), mode=0o644)
    except OSError as e:
        raise TargetSpecError(f"cannot write the calibrated spec to {path}: {e}") from e
    return path


# ---------------------------------------------------------------- measurements


#: The clock every measurement reads: this process's CPU time, not wall time. On one thread they
#: agree on an idle machine; on a shared one, CPU time leaves out the slices the scheduler gives
#: to other processes, which would otherwise inflate every figure by the machine's load.
CLOCK = time.process_time
#: CPU seconds one timing sample lasts (enough calls of the probe): as long as bench_cost_model's
#: samples of whole models, so the fastest sample of either is disturbed alike by other processes.
SAMPLE_S = 0.005


def _time_per_call(fn: Callable[[], object], budget: float) -> float:
    """CPU seconds per call: the fastest of samples of enough calls to last SAMPLE_S, taken for about
    ``budget`` seconds (the sample least disturbed by other processes on a shared machine: their
    cache and memory traffic slows this one's CPU time too; bench_cost_model measures models alike)."""
    fn()
    start = CLOCK()
    fn()
    once = max(CLOCK() - start, 1e-7)
    calls = max(1, int(SAMPLE_S / once))
    samples: list[float] = []
    deadline = CLOCK() + budget
    while len(samples) < 3 or (CLOCK() < deadline and len(samples) < 200):
        start = CLOCK()
        for _ in range(calls):
            fn()
        samples.append((CLOCK() - start) / calls)
    return float(np.min(samples))


def _fastest_interleaved(probes: dict, budget: float, rounds: int = 3) -> dict:
    """Key -> the fastest CPU seconds per call of each probe over ``rounds`` interleaved rounds: a burst
    of load on this shared machine then slows one round of every probe alike, not all of one probe."""
    times: dict = {}
    for _ in range(rounds):
        for key, probe in probes.items():
            times[key] = min(times.get(key, 1.0), _time_per_call(probe, budget / rounds))
    return times


def _gemm_gflops(m: int, k: int, n: int, budget: float) -> float:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    out = np.empty((m, n), np.float32)
    return 2.0 * m * k * n / _time_per_call(lambda: np.matmul(a, b, out=out), budget) / 1e9


def _copy_gbs(nbytes: int, budget: float) -> float:
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    return 2.0 * nbytes / _time_per_call(lambda: np.copyto(dst, src), budget) / 1e9  # read + write


def _add_gbs(nbytes: int, budget: float, copies: int = 1) -> float:
    pairs = [(np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)) for _ in range(copies)]
    turn = [0]

    def add() -> None:
        turn[0] = (turn[0] + 1) % copies
        np.add(*pairs[turn[0]])

    return 3.0 * nbytes / _time_per_call(add, budget) / 1e9  # two reads, one new array written


def _module_costs(spec: TargetSpec, budget: float) -> tuple[float, float, float | None, float | None]:
    """(per-node call µs, per-run µs, native GFLOP/s or None, native µs per plane or None) from
    modules compiled for ``spec``."""
    from cuvil_edge.device_targets.build import build  # lazily: build imports codegen

    x = np.ones((1, 8), np.float32)
    with tempfile.TemporaryDirectory() as cache:
        chains = {
            blocks: build(probe_graphs.ProbePackage(probe_graphs.probe_chain(blocks)), spec, cache_dir=cache)
            for blocks in (1, 11)
        }
        forward, weights = chains[1]._entry.__globals__["_forward"], chains[1].graph.initializers

        def runner(m: Any) -> Callable[[], Any]:
            return lambda: m.run({"x": x})

        probes: dict[int, Callable[[], Any]] = {b: runner(m) for b, m in chains.items()}
        probes[0] = lambda: forward(weights, {"x": x})
        times = _fastest_interleaved(probes, budget)
        call = max((times[11] - times[1]) / 60, 0.05e-6)  # 6 and 66 nodes
        # at least what run() adds around the generated _forward (the feeds' checks, the outputs' dict),
        # and never below one call: under load both differences can come out <= 0 (a --quick run did)
        run = max(times[1] - 6 * call, times[1] - times[0], call)
        native = plane = None
        if spec.native_kernels:  # big planes give the rate, many small ones the cost per plane
            seconds = {}
            for c, size in ((32, 56), (512, 7)):
                model = build(probe_graphs.ProbePackage(probe_graphs.depthwise(c, size)), spec, cache_dir=cache)
                feeds = {"x": np.random.default_rng(0).standard_normal((1, c, size, size), dtype=np.float32)}
                seconds[c] = max(_time_per_call(partial(model.run, feeds), budget) - run - call, 1e-7)
            native = 2.0 * 9 * 32 * 56 * 56 / seconds[32] / 1e9
            plane = max(0.0, (seconds[512] - 2.0 * 9 * 512 * 49 / (native * 1e9)) / 512)
    return call * 1e6, run * 1e6, native, None if plane is None else plane * 1e6


def _kind_overheads(spec: TargetSpec, budget: float, count: int = 8, rounds: int = 3) -> dict[str, float]:
    """µs per call of each probed kernel kind: a module of ``count`` chained calls on tiny tensors,
    less the run's overhead, the node's predicted work and its extra numpy calls; each probe timed
    in ``rounds`` interleaved rounds, the fastest kept (a burst of load on a shared host hits one)."""
    from cuvil_edge.device_targets.build import build
    from cuvil_edge.device_targets.cost_model import kernel_overhead_us, predict

    probes: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory() as cache:
        for op, probe in probe_graphs.kind_probes():
            graph = probe_graphs.chain(op, probe, count)
            node = predict(graph, spec).nodes[0]
            if node.kernel in probes or (probe.kinds and node.kernel not in probe.kinds):
                continue
            model = build(probe_graphs.ProbePackage(graph), spec, cache_dir=cache)
            feeds = {"x": np.random.default_rng(0).standard_normal(probe.shape, dtype=np.float32)}
            probes[node.kernel] = (node, lambda model=model, feeds=feeds: model.run(feeds))
        times = _fastest_interleaved({kind: probe for kind, (_, probe) in probes.items()}, budget, rounds)
    out: dict[str, float] = {}
    for kind, (node, _) in probes.items():
        per_call = (times[kind] - spec.run_overhead_us * 1e-6) / count
        work = node.seconds - node.overhead_s  # tiny, but not nothing
        extra = node.overhead_s - kernel_overhead_us(spec, kind) * 1e-6  # its loops' numpy calls
        out[kind] = max(0.0, (per_call - work - max(extra, 0.0)) * 1e6)
    return out


def _window_tap_us(spec: TargetSpec, budget: float, count: int = 8) -> float:
    """µs per tap of the numpy window loop (MaxPool on small planes): chains of 3x3 and 2x2 padded
    poolings (9 and 4 taps, the same 16 x 8 x 8), timed in interleaved rounds; the slope per tap."""
    from cuvil_edge.device_targets.build import build

    x = {"x": np.random.default_rng(0).standard_normal((1, 16, 8, 8), dtype=np.float32)}
    with tempfile.TemporaryDirectory() as cache:
        models = {
            k: build(
                probe_graphs.ProbePackage(
                    probe_graphs.chain(
                        "MaxPool", Probe((1, 16, 8, 8), {"kernel_shape": [k, k], "pads": [k - 2, k - 2, 1, 1]}), count
                    )
                ),
                spec,
                cache_dir=cache,
            )
            for k in (3, 2)
        }
        times = _fastest_interleaved({k: (lambda model=model: model.run(x)) for k, model in models.items()}, budget)
    return max(0.0, (times[3] - times[2]) / 5 / count * 1e6)


def _transcendental_ns(spec: TargetSpec, budget: float) -> float:
    """ns per element of Softmax over (64, 1024): long rows, so the function's cost shows."""
    return _softmax_excess(spec, budget, (64, 1024), {"transcendental_ns": 0.0, "row_ns": 0.0}) / (64 * 1024)


def _row_ns(spec: TargetSpec, budget: float) -> float:
    """ns per row of Softmax over (4096, 16): short rows, so the loop around each row shows."""
    return _softmax_excess(spec, budget, (4096, 16), {"row_ns": 0.0}) / 4096


def _softmax_excess(spec: TargetSpec, budget: float, shape: tuple[int, int], zeroed: dict, count: int = 4) -> float:
    """ns a Softmax call over ``shape`` takes beyond its prediction with the ``zeroed`` fields at 0."""
    from cuvil_edge.device_targets.build import build
    from cuvil_edge.device_targets.cost_model import predict

    graph = probe_graphs.chain("Softmax", Probe(shape, {"axis": -1}), count)
    rest = predict(graph, spec.model_copy(update=zeroed)).nodes[0].seconds
    feeds = {"x": np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}
    with tempfile.TemporaryDirectory() as cache:
        model = build(probe_graphs.ProbePackage(graph), spec, cache_dir=cache)
        per_call = (_time_per_call(lambda: model.run(feeds), budget) - spec.run_overhead_us * 1e-6) / count
    return max(0.0, (per_call - rest) * 1e9)


def _cold_scale(spec: TargetSpec, budget: float, count: int = 4) -> float:
    """Measured over predicted overhead of the interleaved probes (>= 1): how much slower a call is
    among other kernels than in a loop of its own."""
    from cuvil_edge.device_targets.build import build
    from cuvil_edge.device_targets.cost_model import predict

    graph = probe_graphs.mixed(count)
    prediction = predict(graph, spec)
    feeds = {
        v.name: np.random.default_rng(0).standard_normal(tuple(v.type.shape), dtype=np.float32) for v in graph.inputs
    }
    with tempfile.TemporaryDirectory() as cache:
        model = build(probe_graphs.ProbePackage(graph), spec, cache_dir=cache)
        seconds = min(_time_per_call(lambda: model.run(feeds), budget / 2) for _ in range(2))
    overhead = sum(n.overhead_s for n in prediction.nodes)
    work = prediction.seconds - overhead - prediction.run_overhead_s
    return max(1.0, (seconds - prediction.run_overhead_s - work) / overhead)


# ---------------------------------------------------------------- the host


@contextlib.contextmanager
def _one_thread():
    """BLAS held to one thread (threadpoolctl, a scikit-learn dependency); yields whether it was."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        logger.warning("threadpoolctl is not installed: BLAS may use several threads while calibrating")
        yield False
        return
    with threadpool_limits(1):
        yield True


def _cache_mb() -> float:
    """The per-core L2 cache in MiB (Linux sysfs), else 1."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip().upper()
        return round(int(text.rstrip("K")) / 1024 if text.endswith("K") else int(text.rstrip("M")), 3)
    except (OSError, ValueError):
        return 1.0


def _memory_mb(default: int) -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
    except (ValueError, OSError, AttributeError):
        return default


def _environment(limited: bool) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    env = {k: os.environ[k] for k in OPENBLAS_ENV if k in os.environ}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "threads_limited": limited,
        "openblas_env": (f"kept {env} (OpenBLAS read them at load)" if env else f"unset ({', '.join(OPENBLAS_ENV)})"),
    }
