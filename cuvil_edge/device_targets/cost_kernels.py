"""Per-kernel cost terms of the cost model, and the micro-benchmarks that measure them.

A target spec's ``kernel_ns`` holds ns per unit of work of the kernels the builds run; each term
is measured by ``cuvil-edge calibrate`` on synthetic shapes (never on the models the benchmark
checks), and a term a spec does not list falls back to the roofline of :mod:`cost_model`:

* ``gemm_flop``, ``gemm_mk``, ``gemm_kn``, ``gemm_mn``, ``gemm_call``: one (m x k) @ (k x n) sgemm
  costs ``2mkn flop + mk mk + kn kn + mn mn + call`` ns: the arithmetic, packing each operand
  (the A and B panels) and writing C. Small products are bound by the packing and the call, not
  the arithmetic: a linear fit over 40 synthetic shapes (8 to 12544 per dim), operands out of L2
  as in a model (its other layers have evicted them).
* ``dw_plane``, ``dw_pad``, ``dw_tap``, ``dw_strided_tap``: the native depthwise convolution
  (``cuvil_depthwise_conv2d_f32``): per plane; per element of the padded plane it copies; per
  tap and element of the flat stride-1 accumulator (``oh x padded width``, vectorised); per tap
  and output element of the strided path (a scalar gather).
* ``reduce_element``, ``reduce_row``: numpy's mean over trailing axes, per input element and per
  output (GlobalAveragePool and the Reduce* ops).
* ``ln_element``, ``ln_row``: the native LayerNorm kernel, per element and per row.
* ``gather``, ``gather_strided``: ns per element of a window copy (im2col: whole or in row blocks)
  of a stride-1 convolution, and of a strided one (every other input column: a slower gather).
* ``gemv_element``, ``gemv_call``: a product with one row (or one column) is a vector times a
  matrix: numpy hands it to sgemv, which streams the matrix once without packing panels; per
  element of the matrix and per call, fitted to synthetic (1 x k) @ (k x n) products out of L2.
* ``mp_plane``, ``mp_pad``, ``mp_tap``: the native max pooling (``cuvil_max_pool2d_f32``): per plane,
  per element of the padded plane it fills, per tap and output element of its row loop (a compare
  and select, not the depthwise kernel's multiply-add), fitted to synthetic 2x2 and 3x3 poolings.
* ``gemm_batch_call``: the fixed ns of each further product of one batched ``np.matmul`` (numpy's
  loop over the leading dims calls sgemm per product without numpy's own call setup, which
  ``gemm_call`` includes): fitted to the slope over the count of stacked synthetic products.
* ``softmax_tail_row``, ``softmax_tail_element``: the native Softmax (``cuvil_softmax_f32``)
  vectorises each row in blocks of the SIMD width; a row whose length is not a multiple of it
  runs the remainder in a scalar loop (scalar ``expf``): per such row, and per remainder element.
  Fitted over row lengths around one to three SIMD widths.
* ``fresh_byte``: ns per byte of an array above the allocator's mmap limit (glibc: 32 MiB), whose
  pages fault in on first touch, every call (large batch-16 activations).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from cuvil_edge.ir.ops._conv_path import im2col_block_rows

#: Arrays at least this large come from mmap on every allocation (glibc's largest dynamic mmap
#: threshold, DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): their pages are faulted in by each call.
MMAP_LIMIT = 32 << 20

GEMM_KEYS = ("gemm_flop", "gemm_mk", "gemm_kn", "gemm_mn", "gemm_call")
SOFTMAX_TAIL_KEYS = ("softmax_tail_row", "softmax_tail_element")
GEMV_KEYS = ("gemv_element", "gemv_call")
MAX_POOL_KEYS = ("mp_plane", "mp_pad", "mp_tap")
DEPTHWISE_KEYS = ("dw_plane", "dw_pad", "dw_tap", "dw_strided_tap")


def gemm_ns(terms: dict[str, float], m: int, k: int, n: int) -> float | None:
    """ns of one (m x k) @ (k x n) product from the fitted terms, None where they are not measured."""
    if not all(key in terms for key in GEMM_KEYS):
        return None
    if min(m, n) == 1 and all(key in terms for key in GEMV_KEYS):  # sgemv: the matrix streamed once
        return terms["gemv_call"] + terms["gemv_element"] * k * max(m, n)
    return (
        terms["gemm_flop"] * 2.0 * m * k * n
        + terms["gemm_mk"] * m * k
        + terms["gemm_kn"] * k * n
        + terms["gemm_mn"] * m * n
        + terms["gemm_call"]
    )


def gemm_products_ns(terms: dict[str, float], m: int, k: int, n: int, count: int, calls: int) -> float | None:
    """ns of ``count`` (m x k) @ (k x n) products made by ``calls`` np.matmul calls (a batched call
    makes several): each call's first product pays ``gemm_call``, the others ``gemm_batch_call``."""
    one = gemm_ns(terms, m, k, n)
    if one is None:
        return None
    calls = count if calls <= 0 else min(calls, count)
    batch_call = terms.get("gemm_batch_call", terms["gemm_call"])
    return count * one - (count - calls) * (terms["gemm_call"] - batch_call)


def softmax_tail_ns(terms: dict[str, float], rows: int, width: int, lanes: int) -> float:
    """ns the native Softmax's scalar remainder adds over ``rows`` rows of ``width`` elements when
    ``width`` is not a multiple of ``lanes`` (the float32 SIMD width); 0 where not measured."""
    tail = width % max(lanes, 1)
    if not tail or not all(key in terms for key in SOFTMAX_TAIL_KEYS):
        return 0.0
    return rows * (terms["softmax_tail_row"] + tail * terms["softmax_tail_element"])


def max_pool_ns(
    terms: dict[str, float], planes: int, padded: tuple[int, int], out: tuple[int, int], taps: int
) -> float | None:
    """ns of the native max pooling over ``planes`` planes, None where it is not measured."""
    if not all(key in terms for key in MAX_POOL_KEYS):
        return None
    work = terms["mp_pad"] * padded[0] * padded[1] + terms["mp_tap"] * taps * math.prod(out)
    return planes * (terms["mp_plane"] + work)


def depthwise_ns(
    terms: dict[str, float], planes: int, padded: tuple[int, int], out: tuple[int, int], taps: int, strided: bool
) -> float | None:
    """ns of the native depthwise kernel over ``planes`` planes, None where it is not measured."""
    if not all(key in terms for key in DEPTHWISE_KEYS):
        return None
    (ph, pw), (oh, ow) = padded, out
    work = terms["dw_strided_tap"] * taps * oh * ow if strided else terms["dw_tap"] * taps * oh * pw
    return planes * (terms["dw_plane"] + terms["dw_pad"] * ph * pw + work)


# ---------------------------------------------------------------- measurements

CLOCK = time.process_time  # CPU time, as calibrate.CLOCK (the machine may be shared)
SAMPLE_S = 0.005  # as calibrate.SAMPLE_S


def _time_per_call(fn: Callable[[], object], budget: float) -> float:
    """CPU seconds per call, the fastest of SAMPLE_S samples (as calibrate._time_per_call)."""
    fn()
    start = CLOCK()
    fn()
    calls = max(1, int(SAMPLE_S / max(CLOCK() - start, 1e-7)))
    samples: list[float] = []
    deadline = CLOCK() + budget
    while len(samples) < 3 or (CLOCK() < deadline and len(samples) < 100):
        start = CLOCK()
        for _ in range(calls):
            fn()
        samples.append((CLOCK() - start) / calls)
    return float(np.min(samples))


def _cycled(arrays: Callable[[], tuple], fn: Callable, budget: float, total: int = 8 << 20) -> float:
    """Median CPU seconds of ``fn(*arrays())`` cycling through enough copies of the arrays (``total``
    bytes in all, past L2) that each call finds its operands where a model's kernel does: out of L2,
    last touched before other layers ran."""
    first = arrays()
    size = sum(a.nbytes for a in first if isinstance(a, np.ndarray))
    copies = [first] + [arrays() for _ in range(max(1, min(32, -(-total // max(size, 1)))) - 1)]
    turn = [0]

    def call() -> None:
        turn[0] = (turn[0] + 1) % len(copies)
        fn(*copies[turn[0]])

    return _time_per_call(call, budget)


def gemm_shapes(count: int = 40, seed: int = 7) -> list[tuple[int, int, int]]:
    """Synthetic (m, k, n): log-uniform, m in [8, 2048], k in [8, 8192] (an im2col's C x taps reaches
    4608), n in [1, 12544], at most 0.25 GFLOP."""
    rng = np.random.default_rng(seed)
    shapes: list[tuple[int, int, int]] = []
    while len(shapes) < count:
        m = int(round(math.exp(rng.uniform(math.log(8), math.log(2048)))))
        k = int(round(math.exp(rng.uniform(math.log(8), math.log(8192)))))
        n = int(round(math.exp(rng.uniform(0, math.log(12544)))))
        if 2 * m * k * n <= 2.5e8:
            shapes.append((m, k, n))
    return shapes


def fit_nonnegative(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares of relative error (each row divided by its time) with coefficients >= 0
    (a term that would come out negative is dropped and the rest refitted)."""
    a, b = rows / seconds[:, None], np.ones(len(seconds))
    keep = np.ones(rows.shape[1], bool)
    coef = np.zeros(rows.shape[1])
    while keep.any():
        sol = np.linalg.lstsq(a[:, keep], b, rcond=None)[0]
        if (sol >= 0).all():
            coef[keep] = sol
            break
        keep[np.flatnonzero(keep)[np.argmin(sol)]] = False
    return coef


def measure_gemm(budget: float, quick: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """(terms, GFLOP/s per shape): the gemm_* terms fitted to sgemm times of synthetic shapes, each
    product cycling through copies of its operands (8 MiB in all, past L2) as a model's layers do:
    its weights and its input were last touched before other layers ran."""
    rows, seconds, rates = [], [], {}
    for m, k, n in gemm_shapes(16 if quick else 40):
        out = np.empty((m, n), np.float32)
        t = _cycled(
            lambda m=m, k=k, n=n: (np.full((m, k), 0.5, np.float32), np.full((k, n), 0.25, np.float32)),  # type: ignore[misc]  # the defaults bind this iteration's values
            lambda a, b, out=out: np.matmul(a, b, out=out),
            budget,
        )
        rows.append((2.0 * m * k * n, m * k, k * n, m * n, 1.0))
        seconds.append(t)
        rates["x".join(map(str, (m, k, n)))] = 2.0 * m * k * n / t / 1e9
    coef = fit_nonnegative(np.array(rows), np.array(seconds)) * 1e9
    return dict(zip(GEMM_KEYS, (float(c) for c in coef), strict=True)), rates


def _native_library():
    """The native kernels' library, or None where it cannot be built (no compiler, disabled)."""
    try:
        from cuvil_edge.ir.ops._native import library
    except ImportError:
        return None
    return library()


def measure_depthwise(budget: float) -> dict[str, float]:
    """dw_* terms: the native kernel called directly on synthetic 3x3 and 5x5 depthwise convolutions
    (same padding) at stride 1 and 2 over plane sizes 7 to 112; {} without the native library."""
    lib = _native_library()
    if lib is None:
        return {}
    rng = np.random.default_rng(0)
    rows, seconds = [], []
    for c, size, stride, kernel in (
        (512, 7, 1, 3),
        (256, 14, 1, 3),
        (96, 28, 1, 3),
        (32, 56, 1, 3),
        (8, 112, 1, 3),
        (256, 14, 1, 5),
        (32, 56, 1, 5),
        (256, 14, 2, 3),
        (96, 28, 2, 3),
        (32, 56, 2, 3),
        (8, 112, 2, 3),
        (384, 7, 2, 3),
        (96, 28, 2, 5),
        (256, 14, 2, 5),
    ):
        w = rng.standard_normal((c, 1, kernel, kernel), dtype=np.float32)
        pad = kernel // 2
        o = (size + 2 * pad - kernel) // stride + 1
        ph = pw = (o - 1) * stride + kernel
        y = np.empty((1, c, o, o), np.float32)
        rest = (
            w.ctypes.data,
            None,
            y.ctypes.data,
            1,
            c,
            size,
            size,
            kernel,
            kernel,
            stride,
            stride,
            1,
            1,
            pad,
            pad,
            o,
            o,
            ph,
            pw,
            0.0,
            np.inf,
        )
        seconds.append(
            _cycled(
                lambda c=c, size=size: (np.full((1, c, size, size), 0.5, np.float32),),  # type: ignore[misc]  # the defaults bind this iteration's values
                lambda x, rest=rest: lib.cuvil_depthwise_conv2d_f32(x.ctypes.data, *rest),
                budget,
            )
        )
        flat, taps = stride == 1, kernel * kernel
        rows.append((c, c * ph * pw, c * taps * o * pw if flat else 0.0, 0.0 if flat else c * taps * o * o))
    coef = fit_nonnegative(np.array(rows, float), np.array(seconds)) * 1e9
    return dict(zip(DEPTHWISE_KEYS, (float(v) for v in coef), strict=True))


def measure_gather(budget: float) -> dict[str, float]:
    """``gather`` / ``gather_strided``: ns per element of an im2col copy, the windows of a padded 3x3
    convolution's input (stride 1, then 2) copied into (C, 3, 3, rows, W) blocks of ~1 MiB, as
    k_conv's blocked path does (its whole-image path copies the same view in one call)."""
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for key, stride in (("gather", 1), ("gather_strided", 2)):
        per = []
        for c, size in ((64, 56), (128, 28), (16, 112), (3, 224)):
            x = np.zeros((c, size + 2, size + 2), np.float32)
            x[:, 1:-1, 1:-1] = rng.standard_normal((c, size, size), dtype=np.float32)
            st, o = x.strides, (size - 1) // stride + 1
            win = np.ndarray((c, o, o, 3, 3), np.float32, x, 0, (st[0], st[1] * stride, st[2] * stride, st[1], st[2]))
            rows = im2col_block_rows(o, c * 9 * o * 4)
            block = np.empty((c, 3, 3, rows, o), np.float32)
            # timed within this iteration: the loop's block, win and rows are the ones meant
            t = _time_per_call(lambda: np.copyto(block, win[:, :rows].transpose(0, 3, 4, 1, 2)), budget)  # noqa: B023
            per.append(t / block.size)
        out[key] = float(np.median(per)) * 1e9
    return out


def measure_fresh(budget: float) -> float:
    """ns per byte a 48 MiB result costs beyond the same pass into an existing array (its pages
    fault in on every call: above the allocator's mmap limit)."""
    a = np.ones(12 << 20, np.float32)
    b, c = a.copy(), np.empty_like(a)
    fresh = _time_per_call(lambda: np.add(a, b), budget)
    reused = _time_per_call(lambda: np.add(a, b, out=c), budget)
    return max(0.0, fresh - reused) / a.nbytes * 1e9


def measure_reduce(budget: float) -> dict[str, float]:
    """``reduce_element`` / ``reduce_row``: ns per input element and per output of numpy's mean over
    the trailing axes (GlobalAveragePool, ReduceMean), fitted over long and short rows."""
    rows, seconds = [], []
    for shape in (
        (1, 64, 56, 56),
        (1, 256, 28, 28),
        (16, 512, 7, 7),
        (16, 64, 2, 2),
        (1, 1024, 4, 4),
        (4, 32, 112, 112),
    ):
        seconds.append(
            _cycled(
                lambda shape=shape: (np.full(shape, 0.5, np.float32),),  # type: ignore[misc]  # the defaults bind this iteration's values
                lambda x: x.mean(axis=(2, 3), keepdims=True),
                budget,
            )
        )
        rows.append((math.prod(shape), shape[0] * shape[1], 1.0))
    coef = fit_nonnegative(np.array(rows, float), np.array(seconds)) * 1e9
    return {"reduce_element": float(coef[0]), "reduce_row": float(coef[1])}


def measure_layer_norm(budget: float) -> dict[str, float]:
    """``ln_element`` / ``ln_row``: the native LayerNorm kernel (``cuvil_layer_norm_f32``) called
    directly, per element and per row, fitted over rows of 16 to 1024; {} without the library."""
    lib = _native_library()
    if lib is None:
        return {}
    rows, seconds = [], []
    for r, d in ((4096, 16), (1024, 64), (256, 256), (64, 1024), (512, 384), (16, 768)):
        scale, bias, y = np.ones(d, np.float32), np.zeros(d, np.float32), np.empty((r, d), np.float32)
        rest = (scale.ctypes.data, bias.ctypes.data, y.ctypes.data, r, d, 1e-5)
        seconds.append(
            _cycled(
                lambda r=r, d=d: (np.full((r, d), 0.5, np.float32),),  # type: ignore[misc]  # the defaults bind this iteration's values
                lambda x, rest=rest: lib.cuvil_layer_norm_f32(x.ctypes.data, *rest),
                budget,
            )
        )
        rows.append((r * d, r, 1.0))
    coef = fit_nonnegative(np.array(rows, float), np.array(seconds)) * 1e9
    return {"ln_element": float(coef[0]), "ln_row": float(coef[1])}


def measure_gemm_batched(terms: dict[str, float], budget: float, seed: int = 11) -> dict[str, float]:
    """``gemm_batch_call``: the per-product ns of a batched np.matmul beyond the fitted terms of its
    arithmetic and packing (``gemm_ns`` less ``gemm_call``), from the slope between 8 and 64 stacked
    products of synthetic small shapes (log-uniform dims 4 to 96), the median over the shapes."""
    rng = np.random.default_rng(seed)
    excess = []
    for _ in range(8):
        m, k, n = (int(round(math.exp(rng.uniform(math.log(4), math.log(96))))) for _ in range(3))
        seconds: dict[int, float] = {}
        for count in (8, 64):
            seconds[count] = _cycled(
                lambda c=count, m=m, k=k, n=n: (  # type: ignore[misc]  # the defaults bind this iteration's values
                    np.full((c, m, k), 0.5, np.float32),
                    np.full((c, k, n), 0.25, np.float32),
                ),
                lambda a, b: np.matmul(a, b),
                budget,
            )
        slope = (seconds[64] - seconds[8]) / 56 * 1e9
        # terms holds the GEMM keys (measure_gemm's), so gemm_ns gives a number
        excess.append(slope - (gemm_ns(terms, m, k, n) - terms["gemm_call"]))  # type: ignore[operator]
    return {"gemm_batch_call": max(0.0, float(np.median(excess)))}


def measure_softmax_tail(budget: float, lanes: int) -> dict[str, float]:
    """``softmax_tail_row`` / ``softmax_tail_element``: the native Softmax over 1024 rows of lengths
    around one to three SIMD widths (``lanes`` float32 elements), per-row time fitted as a + b x
    length + (a row with a remainder) + (remainder elements); {} without the native library."""
    lib = _native_library()
    if lib is None or lanes < 2:
        return {}
    rows, seconds = [], []
    widths = sorted(
        {w for base in (lanes, 2 * lanes, 3 * lanes) for w in (base, base + 1, base + lanes // 2, base + lanes - 1)}
    )
    for width in widths:
        y = np.empty((1024, width), np.float32)
        seconds.append(
            _cycled(
                lambda w=width: (np.random.default_rng(w).standard_normal((1024, w), dtype=np.float32),),  # type: ignore[misc]  # the defaults bind this iteration's values
                lambda x, y=y: lib.cuvil_softmax_f32(x.ctypes.data, y.ctypes.data, 1024, x.shape[1]),
                budget,
            )
            / 1024
        )
        tail = width % lanes
        rows.append((1.0, width, float(tail > 0), tail))
    coef = fit_nonnegative(np.array(rows, float), np.array(seconds)) * 1e9
    return {"softmax_tail_row": float(coef[2]), "softmax_tail_element": float(coef[3])}


def fit_gemm(rates: dict[tuple[int, int, int], float], peak: float) -> tuple[float, float]:
    """(gemm_efficiency, gemm_half_dim) that best fit the measured GFLOP/s by shape, in log space:
    rate = peak * efficiency * prod(d / (d + half)) over m, k, n."""
    shapes, measured = list(rates), np.log(np.array(list(rates.values())))
    best = (1.0, 16.0, np.inf)
    for half in np.geomspace(0.5, 256, 80):
        shape = np.array([sum(np.log(d / (d + half)) for d in s) for s in shapes])
        scale = float(np.clip(np.mean(measured - np.log(peak) - shape), np.log(0.05), 0.0))
        error = float(np.sum((measured - np.log(peak) - shape - scale) ** 2))
        if error < best[2]:
            best = (float(np.exp(scale)), float(half), error)
    return best[0], best[1]


def measure_gemv(budget: float, seed: int = 13) -> dict[str, float]:
    """``gemv_element`` / ``gemv_call``: (1 x k) @ (k x n) over 12 synthetic shapes (log-uniform k in
    [16, 4096], n in [8, 4096]), operands cycled out of L2, fitted per matrix element and per call."""
    rng = np.random.default_rng(seed)
    rows, seconds = [], []
    for _ in range(12):
        k, n = (int(round(math.exp(rng.uniform(math.log(lo), math.log(4096))))) for lo in (16, 8))
        seconds.append(
            _cycled(
                lambda k=k, n=n: (np.full((1, k), 0.5, np.float32), np.full((k, n), 0.25, np.float32)),  # type: ignore[misc]  # the defaults bind this iteration's values
                lambda a, b: np.matmul(a, b),
                budget,
            )
        )
        rows.append((k * n, 1.0))
    coef = fit_nonnegative(np.array(rows, float), np.array(seconds)) * 1e9
    return dict(zip(GEMV_KEYS, (float(v) for v in coef), strict=True))


def measure_max_pool(budget: float) -> dict[str, float]:
    """mp_* terms: the native max pooling called directly on synthetic 2x2 stride-2 and 3x3 stride-1/2
    (padded) poolings over planes of 7 to 112; {} without the native library."""
    lib = _native_library()
    if lib is None:
        return {}
    rows, seconds = [], []
    for c, size, kernel, stride, pad in (
        (256, 14, 2, 2, 0),
        (64, 28, 2, 2, 0),
        (16, 112, 2, 2, 0),
        (512, 8, 2, 2, 0),
        (64, 56, 3, 2, 1),
        (16, 112, 3, 2, 1),
        (128, 14, 3, 1, 1),
        (32, 28, 3, 1, 1),
    ):
        o = (size + 2 * pad - kernel) // stride + 1
        ph = pw = (o - 1) * stride + kernel
        y = np.empty((1, c, o, o), np.float32)
        rest = (y.ctypes.data, c, size, size, kernel, kernel, stride, stride, 1, 1, pad, pad, o, o, ph, pw)
        seconds.append(
            _cycled(
                lambda c=c, size=size: (np.full((1, c, size, size), 0.5, np.float32),),  # type: ignore[misc]  # the defaults bind this iteration's values
                lambda x, rest=rest: lib.cuvil_max_pool2d_f32(x.ctypes.data, *rest),
                budget,
            )
        )
        rows.append((c, c * ph * pw, c * kernel * kernel * o * o))
    coef = fit_nonnegative(np.array(rows, float), np.array(seconds)) * 1e9
    return dict(zip(MAX_POOL_KEYS, (float(v) for v in coef), strict=True))


def measure_pad_us(budget: float) -> float:
    """µs of one np.pad call on a small array (AveragePool pads its window counts with it)."""
    small = np.ones((1, 1, 8, 8), np.float32)
    return _time_per_call(lambda: np.pad(small, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=1), budget) * 1e6
