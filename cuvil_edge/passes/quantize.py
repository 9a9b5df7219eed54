"""Post-training static quantization (int8 QDQ); fp16 storage and the fold at load live in
:mod:`.weight_storage` and are re-exported here.

    Conv/Gemm/MatMul(x, W, ...), W a float32 initializer          (and CuvilFusedConv/Gemm/MatMul)
      ⇒  Wq int8 (per output channel, symmetric, zero point 0) → DequantizeLinear(axis) → W
          x → QuantizeLinear(s, z) → DequantizeLinear(s, z) → op        (per tensor, from calibration)
    W float32 initializer of ≥ FP16_MIN_ELEMENTS elements  ⇒  W16 float16 → Cast(to=float32) → W

The dequantized value keeps the weight's name, so the ops that read it are unchanged and every
target builds the result with its ordinary kernels.  Biases stay float32 (they are small, and a
QDQ graph computes the accumulation in float anyway).

Run these AFTER ``passes.optimize``: constant folding would turn DequantizeLinear(initializer) back
into a float32 initializer.  That fold is exactly what :func:`dequantize_at_load` does on purpose on
the agent: a target whose kernels compute in fp32 expands the weights once, when the package is
loaded, instead of on every run.

Activation ranges come from :func:`calibrate_ranges` on sample batches the coordinator provides:
``mse`` (the default: the min-max range shrunk to the factor with the least rounding-plus-clipping
error on the values seen), ``minmax`` (the extremes seen) or ``percentile`` (per batch, the
``percentile`` and ``100 - percentile`` points, averaged over batches, which ignores rare outliers).

Weights: given the same samples (``quantize_int8(graph, ranges, samples=batches)``) they are rounded
by GPTQ on the float32 graph's input second moments, which keeps each layer's output on those inputs
close to fp32 (:mod:`cuvil_edge.passes.quantize_weights`); without samples, or ``weights="rtn"``, to
nearest. Options: ``weights="gptq"`` takes each layer's second moments from the int8 graph quantized so
far (sequential GPTQ) and ``bias_correction=True`` shifts each Conv/Gemm's float32 bias by the mean
fp32 - int8 output per channel on the samples; neither was better on ResNet-18.
``keep_float`` leaves named ops in fp32 (a first conv on raw pixels: tiny, and no rounding helps it).
Measured (bench/results/quantization.md): on a random-weight ResNet-18, min-max RTN agrees with fp32 on
94.1 % of top-1s, MSE ranges + GPTQ with the stem conv in fp32 on 98.05 % of 256 inputs and 97.75 % of
1,024, short of 99 %: per-tensor int8 activations alone, fp32 weights, leave an output error that is
about 85 % of the total, so no weight rounding reaches 99 % on this network's near-tied top-2s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from cuvil_edge.errors import CuvilError, ExecutionError, PassError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.interpreter import bind_inputs
from cuvil_edge.passes._infra import (
    all_names,
    fresh_graph_name,
    fresh_tensor_name,
)
from cuvil_edge.passes.quantize_weights import Site, sequential
from cuvil_edge.passes.weight_storage import FP16_MIN_ELEMENTS, dequantize_at_load, finish_graph, store_fp16

#: op -> how to find the output-channel axis of its weight (input 1), given the node and weight rank.
QUANTIZABLE = {
    "Conv": lambda node, rank: 0,
    "CuvilFusedConv": lambda node, rank: 0,
    # Gemm's B is [K, N], or [N, K] with transB: the output channels are N
    "Gemm": lambda node, rank: 0 if node.attr("transB", 0) else 1,
    "CuvilFusedGemm": lambda node, rank: 0 if node.attr("transB", 0) else 1,
    # MatMul's B is [..., K, N]
    "MatMul": lambda node, rank: rank - 1,
    "CuvilFusedMatMul": lambda node, rank: rank - 1,
}
METHODS = ("mse", "minmax", "percentile")
#: How quantize_int8 rounds the weights: error-compensating with each layer's Hessian from the float32
#: graph's inputs ("gptq_fp32", the default with samples) or from the inputs the quantized prefix gives
#: it ("gptq"; both need the samples), or to nearest.
WEIGHT_METHODS = ("gptq", "gptq_fp32", "rtn")
QDQ_VERSION = 13  # the first opset with per-axis scales


def quantizable(graph: Graph) -> list[tuple[Node, str, str, int]]:
    """(node, activation input, weight initializer, channel axis) for every op this pass quantizes:
    a float32 activation at input 0 and a float32 initializer of rank >= 2 at input 1."""
    out = []
    inputs = {v.name for v in graph.inputs}
    for node in graph.nodes:
        if node.op_type not in QUANTIZABLE or len(node.inputs) < 2:
            continue
        x, w = node.inputs[0], node.inputs[1]
        weight = graph.initializers.get(w)
        if (
            weight is None
            or w in inputs
            or weight.dtype != np.float32
            or weight.ndim < 2
            or x in graph.initializers
            or graph.types[x].dtype != "float32"
        ):
            continue
        out.append((node, x, w, QUANTIZABLE[node.op_type](node, weight.ndim)))
    return out


def _no_quantizable_ops(graph: Graph) -> PassError:
    return PassError(
        f"graph {graph.name!r} has no op to quantize (Conv, Gemm or MatMul, plain or fused, with a "
        "float32 constant weight of rank >= 2); ship it as fp32 or with store_fp16 instead, and run "
        "passes.optimize first so weights are initializers"
    )


# --- calibration ----------------------------------------------------------------------------------
def _batches(graph: Graph, samples) -> Iterable[dict[str, np.ndarray]]:
    """Feed dicts from ``samples``: an array (one batch for the single input), or an iterable of
    feed dicts / arrays."""
    if isinstance(samples, np.ndarray) or isinstance(samples, Mapping):
        samples = [samples]
    for item in samples:
        if isinstance(item, Mapping):
            yield dict(item)
        else:
            if len(graph.inputs) != 1:
                raise PassError(
                    f"calibration sample is a bare array but graph {graph.name!r} takes inputs "
                    f"{[v.name for v in graph.inputs]}; pass feed dicts naming each input"
                )
            yield {graph.inputs[0].name: item}


def _checked_batches(graph: Graph, samples) -> Iterable[tuple[int, dict[str, np.ndarray]]]:
    """(index, feeds) of each sample batch, refused with a PassError when it holds NaN or Inf or does
    not fit the graph's inputs, or when there is none."""
    count = 0
    for index, feeds in enumerate(_batches(graph, samples)):
        for name, array in feeds.items():
            if isinstance(array, np.ndarray) and array.dtype.kind == "f" and not np.isfinite(array).all():
                raise PassError(
                    f"calibration sample {index} input {name!r} holds NaN or Inf; calibrate on real, "
                    "finite inputs (drop or repair the broken records)"
                )
        try:
            bind_inputs(graph, feeds)
        except ExecutionError as e:
            raise PassError(f"calibration sample {index} does not fit graph {graph.name!r}: {e}") from e
        count += 1
        yield index, feeds
    if count == 0:
        raise PassError(
            "no calibration samples; pass at least one batch of representative inputs "
            "(an array for a single-input graph, or feed dicts)"
        )


def _unfused(graph: Graph) -> Graph:
    """``graph`` with its multi-node fusions written out again: int8 quantizes convolutions one by
    one, and a fused block (CuvilDwPw, CuvilConvAdd) would otherwise stay float."""
    from cuvil_edge.passes import split_fused_blocks  # the package imports the passes, this one too

    return split_fused_blocks(graph)


def calibrate_ranges(
    graph: Graph, samples, method: str = "mse", percentile: float = 99.99
) -> dict[str, tuple[float, float]]:
    """Run ``graph`` on the sample batches; the (lo, hi) range of each activation a quantized op reads.

    ``samples``: one array (a batch for the graph's single input) or an iterable of feed dicts or
    arrays, representative of the data the model will see. ``method``: ``mse`` (the default: the
    min-max range shrunk by the factor that minimises the int8 rounding-plus-clipping error of the
    values seen, measured on up to MSE_SAMPLES values of each tensor per batch), ``minmax`` or
    ``percentile``.

    Raises:
        PassError: no samples, a sample with NaN or Inf, a sample that does not fit the graph's
            inputs, an activation that becomes non-finite, an unknown method or percentile out of
            (50, 100], or a graph without quantizable ops.
    """
    if method not in METHODS:
        raise PassError(f"calibration method {method!r} is unknown; use one of {', '.join(METHODS)}")
    if not 50.0 < percentile <= 100.0:
        raise PassError(f"percentile {percentile} is out of (50, 100]; 99.99 keeps all but the rarest outliers")
    graph = _unfused(graph)
    wanted = {x for _, x, _, _ in quantizable(graph)}
    if not wanted:
        raise _no_quantizable_ops(graph)
    lows: dict[str, list[float]] = {name: [] for name in wanted}
    highs: dict[str, list[float]] = {name: [] for name in wanted}
    kept: dict[str, list[np.ndarray]] = {name: [] for name in wanted}
    rng = np.random.default_rng(0)
    for index, feeds in _checked_batches(graph, samples):
        for name, value in _activations(graph, feeds, wanted).items():
            if not np.isfinite(value).all():
                raise PassError(
                    f"activation {name!r} becomes NaN or Inf on calibration sample {index}; the model "
                    "overflows on this data, so fix the model or the samples before quantizing"
                )
            if value.size == 0:
                continue
            if method == "percentile":
                lo, hi = np.percentile(value, [100.0 - percentile, percentile])
            else:
                lo, hi = value.min(), value.max()
            lows[name].append(float(lo))
            highs[name].append(float(hi))
            if method == "mse":
                flat = value.reshape(-1)
                kept[name].append(flat if flat.size <= MSE_SAMPLES else rng.choice(flat, MSE_SAMPLES, replace=False))
    combine = (lambda v: float(np.mean(v)),) * 2 if method == "percentile" else (min, max)
    ranges = {
        name: (combine[0](lows[name]) if lows[name] else 0.0, combine[1](highs[name]) if highs[name] else 0.0)
        for name in sorted(wanted)
    }
    if method == "mse":
        ranges = {name: _mse_range(np.concatenate(kept[name]), *r) if kept[name] else r for name, r in ranges.items()}
    return ranges


#: Values per tensor and batch that the ``mse`` method keeps (a uniform random subset).
MSE_SAMPLES = 1 << 16
#: Shrink factors of the min-max range the ``mse`` method tries.
MSE_FACTORS = np.linspace(0.3, 1.0, 71)


def _fake_quantize(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    scale, zero = activation_params(lo, hi)
    info = np.iinfo(zero.dtype)
    q = np.clip(np.rint(values / scale) + float(zero), info.min, info.max)
    return (q - float(zero)) * scale


def _mse_range(values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """The range f·(lo, hi), f in MSE_FACTORS, whose int8 quantization of ``values`` has the least
    squared error (rounding error falls with f, clipping error grows)."""
    values = values.astype(np.float32)
    errors = [float(np.mean((_fake_quantize(values, lo * f, hi * f) - values) ** 2)) for f in MSE_FACTORS]
    best = float(MSE_FACTORS[int(np.argmin(errors))])
    return lo * best, hi * best


def _activations(graph: Graph, feeds: Mapping[str, np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
    """The values named in ``wanted`` on one batch (the interpreter's loop, keeping what we measure)."""
    env: dict[str, np.ndarray] = dict(graph.initializers)
    env.update(feeds)
    last_use = {name: i for i, node in enumerate(graph.nodes) for name in node.inputs}
    seen = {name: env[name] for name in wanted if name in feeds}
    for index, node in enumerate(graph.nodes):
        try:
            results = ops.get(node.op_type, node.describe()).kernel(node, *[env[n] if n else None for n in node.inputs])
        except CuvilError:
            raise
        except Exception as e:  # a kernel fault names the node, as in the interpreter
            raise PassError(f"calibration: {node.describe()} failed: {type(e).__name__}: {e}") from e
        for name, value in zip(node.outputs, results, strict=False):
            if name:
                env[name] = value
                if name in wanted:
                    seen[name] = value
        for name in node.inputs:  # free as we go: a ResNet's activations at batch 32 are big
            if last_use.get(name) == index and name not in graph.initializers:
                env.pop(name, None)
    return seen


# --- int8 -----------------------------------------------------------------------------------------
def weight_scales(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per channel along ``axis``): symmetric, in [-127, 127], zero point 0.
    An all-zero channel gets scale 1 (0 would divide by zero; any scale stores its zeros exactly)."""
    others = tuple(i for i in range(weight.ndim) if i != axis)
    amax = np.abs(weight).max(axis=others).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    shape = [1] * weight.ndim
    shape[axis] = -1
    q = np.clip(np.rint(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def activation_params(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """(float32 scale, zero point) for a per-tensor range: uint8 for a range that never goes below 0
    (after a Relu), int8 otherwise. The range always includes 0 so that 0 (padding) is exact; a
    constant range (lo == hi == 0) gets scale 1.

    Raises:
        PassError: the range is not a finite interval (recalibrate).
    """
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise PassError(f"activation range ({lo}, {hi}) is not a finite interval; recalibrate")
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    qmin, qmax, dtype = (0, 255, np.uint8) if lo >= 0 else (-128, 127, np.int8)
    scale = np.float32((hi - lo) / (qmax - qmin))
    if not scale > np.finfo(np.float32).tiny:
        scale = np.float32(1.0)
    zero = int(np.clip(np.rint(qmin - lo / float(scale)), qmin, qmax))
    return np.array(scale, np.float32), np.array(zero, dtype)


def quantize_int8(
    graph: Graph,
    ranges: Mapping[str, tuple[float, float]],
    *,
    samples=None,
    weights: str | None = None,
    bias_correction: bool | None = None,
    keep_float: Iterable[str] = (),
) -> Graph:
    """The QDQ int8 form of ``graph``: int8 weights with per-channel scales and per-tensor QDQ on the
    activations entering Conv/Gemm/MatMul (plain or fused). ``ranges`` is what
    :func:`calibrate_ranges` returned for this graph.

    ``samples``: the calibration batches (as for :func:`calibrate_ranges`); with them the weights are
    rounded by GPTQ (see :mod:`cuvil_edge.passes.quantize_weights`), which keeps each layer's output on
    those inputs close to what the layer computed: ``weights="gptq_fp32"`` (the default when samples
    are given) takes each layer's input second moments from the float32 graph; ``"gptq"`` from the int8
    graph as quantized so far, in op order, so later layers compensate for earlier error (not better on
    ResNet-18: bench/results/quantization.md). Without samples, or with ``weights="rtn"``, each weight is
    rounded to nearest.
    ``bias_correction`` (default off; needs the samples; not better on ResNet-18 either): after a
    Conv/Gemm with a float32 bias is
    quantized, its bias gets the mean over the samples of the fp32 minus the int8 graph's output of that
    op (before a fused activation), per output channel, so its quantization error has mean zero there.
    ``keep_float``: names of quantizable nodes left in fp32 (weight and input), e.g. a first conv that
    reads raw pixels (its inputs are white, so no rounding scheme helps it, and it is tiny).

    Raises:
        PassError: no quantizable op, an activation without a range, a range that is not a finite
            interval, an unknown weight method, GPTQ or bias correction without samples, bad samples (as in
            calibrate_ranges), an unknown ``keep_float`` name, or the result does not type-check /
            changed the graph's inputs or outputs.
    """
    weights = weights or ("gptq_fp32" if samples is not None else "rtn")
    if weights not in WEIGHT_METHODS:
        raise PassError(f"weight rounding {weights!r} is unknown; use one of {', '.join(WEIGHT_METHODS)}")
    bias_correction = bool(bias_correction)
    if (weights != "rtn" or bias_correction) and samples is None:
        raise PassError(
            f"weights={weights!r}{' with bias correction' if bias_correction else ''} needs the "
            "calibration samples (quantize_int8(graph, ranges, samples=...)); pass them, or "
            "weights='rtn', bias_correction=False"
        )
    graph = _unfused(graph)
    all_sites = quantizable(graph)
    if not all_sites:
        raise _no_quantizable_ops(graph)
    keep = set(keep_float)
    unknown = sorted(keep - {node.name for node, _, _, _ in all_sites})
    if unknown:
        raise PassError(f"keep_float names {unknown}, which are not quantizable nodes of graph {graph.name!r}")
    sites = [site for site in all_sites if site[0].name not in keep]
    missing = sorted({x for _, x, _, _ in sites if x not in ranges})
    if missing:
        raise PassError(
            f"no calibrated range for activations {missing}; run calibrate_ranges on this same graph "
            "(after passes.optimize) and pass its result"
        )
    for x in {x for _, x, _, _ in sites}:  # refuse a bad range before the (slow) Hessians
        activation_params(*ranges[x])
    taken, inits = all_names(graph), dict(graph.initializers)
    before: dict[int, list[Node]] = {}  # id(node) -> nodes to insert before it
    renamed: dict[int, str] = {}  # id(node) -> its new activation input
    activation: dict[str, str] = {}  # activation -> its dequantized name (one QDQ pair per value)
    done: set[str] = set()
    found: dict[str, Site] = {}  # node name -> its codes, scales and inputs in the result
    stored: dict[str, tuple[str, str]] = {}  # weight -> its codes and scales
    for node, x, w, axis in sites:
        insert = before.setdefault(id(node), [])
        if w not in done:  # the DequantizeLinear output takes the weight's name: readers need no change
            done.add(w)
            q, scale = weight_scales(inits[w], axis)
            del inits[w]
            qn, sn = fresh_tensor_name(taken, f"{w}.int8"), fresh_tensor_name(taken, f"{w}.scale")
            stored[w] = (qn, sn)
            inits[qn], inits[sn] = q, scale
            insert.append(
                Node(
                    fresh_graph_name(taken, f"{w}.dequantize"),
                    "DequantizeLinear",
                    (qn, sn),
                    (w,),
                    {"axis": axis},
                    QDQ_VERSION,
                )
            )
        if x not in activation:
            scale, zero = activation_params(*ranges[x])
            sn, zn = fresh_tensor_name(taken, f"{x}.scale"), fresh_tensor_name(taken, f"{x}.zero_point")
            qx, dx = fresh_graph_name(taken, f"{x}.quantized"), fresh_graph_name(taken, f"{x}.dequantized")
            inits[sn], inits[zn] = scale, zero
            insert.append(
                Node(fresh_graph_name(taken, f"{x}.quantize"), "QuantizeLinear", (x, sn, zn), (qx,), {}, QDQ_VERSION)
            )
            insert.append(
                Node(
                    fresh_graph_name(taken, f"{x}.dequantize"), "DequantizeLinear", (qx, sn, zn), (dx,), {}, QDQ_VERSION
                )
            )
            activation[x] = dx
        renamed[id(node)] = activation[x]
        found.setdefault(node.name, Site(w, *stored[w], axis, x, activation[x]))
    nodes: list[Node] = []
    for node in graph.nodes:
        nodes.extend(before.get(id(node), []))
        if id(node) in renamed:
            node = Node(
                node.name, node.op_type, (renamed[id(node)], *node.inputs[1:]), node.outputs, node.attrs, node.version
            )
        nodes.append(node)
    result = finish_graph(graph, nodes, inits, packaged=True)
    if weights == "rtn" and not bias_correction:
        return result
    batches = [feeds for _, feeds in _checked_batches(graph, samples)]
    return finish_graph(
        graph,
        nodes,
        sequential(
            graph,
            result,
            found,
            batches,
            weights=weights != "rtn",
            from_quantized=weights == "gptq",
            bias_correction=bias_correction,
        ),
    )


__all__ = [
    "METHODS",
    "WEIGHT_METHODS",
    "calibrate_ranges",
    "quantize_int8",
    "store_fp16",
    "dequantize_at_load",
    "quantizable",
    "weight_scales",
    "activation_params",
    "QUANTIZABLE",
    "FP16_MIN_ELEMENTS",
]
