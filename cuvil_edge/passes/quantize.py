"""Post-training static quantization (int8 QDQ), fp16 weight storage, and the agent's fold at load.

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
``minmax`` (the extremes seen) or ``percentile`` (per batch, the ``percentile`` and
``100 - percentile`` points, averaged over batches, which ignores rare outliers).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from cuvil_edge.errors import CuvilError, ExecutionError, PassError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.interpreter import bind_inputs
from cuvil_edge.passes._infra import all_names, check_outputs_kept, fresh_name, rebuild

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
#: Smaller float32 initializers stay float32 under fp16 storage: they save nothing worth a Cast, and
#: small constants (epsilons, shifts, scales) are where fp16 rounding would hurt.
FP16_MIN_ELEMENTS = 16
FP16_MAX = float(np.finfo(np.float16).max)
#: ONNX TensorProto code of float32 (Cast's ``to``).
FLOAT32_CODE = 1
METHODS = ("minmax", "percentile")
QDQ_VERSION = 13  # the first opset with per-axis scales


def _base(name: str) -> str:
    """A stem for initializer names made from a value name: package tensor names may not look like
    paths (PACKAGE_SPEC §1.3), and torch names its values ``/layer/Relu_output_0``."""
    return "/".join(p for p in name.split("/") if p not in ("", "..")) or "value"


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
        if (weight is None or w in inputs or weight.dtype != np.float32 or weight.ndim < 2
                or x in graph.initializers or graph.types[x].dtype != "float32"):
            continue
        out.append((node, x, w, QUANTIZABLE[node.op_type](node, weight.ndim)))
    return out


def _no_quantizable_ops(graph: Graph) -> PassError:
    return PassError(f"graph {graph.name!r} has no op to quantize (Conv, Gemm or MatMul, plain or fused, with a "
                     "float32 constant weight of rank >= 2); ship it as fp32 or with store_fp16 instead, and run "
                     "passes.optimize first so weights are initializers")


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
                raise PassError(f"calibration sample is a bare array but graph {graph.name!r} takes inputs "
                                f"{[v.name for v in graph.inputs]}; pass feed dicts naming each input")
            yield {graph.inputs[0].name: item}


def calibrate_ranges(graph: Graph, samples, method: str = "minmax",
                     percentile: float = 99.99) -> dict[str, tuple[float, float]]:
    """Run ``graph`` on the sample batches; the (lo, hi) range of each activation a quantized op reads.

    ``samples``: one array (a batch for the graph's single input) or an iterable of feed dicts or
    arrays, representative of the data the model will see.

    Raises:
        PassError: no samples, a sample with NaN or Inf, a sample that does not fit the graph's
            inputs, an activation that becomes non-finite, an unknown method or percentile out of
            (50, 100], or a graph without quantizable ops.
    """
    if method not in METHODS:
        raise PassError(f"calibration method {method!r} is unknown; use one of {', '.join(METHODS)}")
    if not 50.0 < percentile <= 100.0:
        raise PassError(f"percentile {percentile} is out of (50, 100]; 99.99 keeps all but the rarest outliers")
    wanted = {x for _, x, _, _ in quantizable(graph)}
    if not wanted:
        raise _no_quantizable_ops(graph)
    lows: dict[str, list[float]] = {name: [] for name in wanted}
    highs: dict[str, list[float]] = {name: [] for name in wanted}
    count = 0
    for index, feeds in enumerate(_batches(graph, samples)):
        for name, array in feeds.items():
            if isinstance(array, np.ndarray) and array.dtype.kind == "f" and not np.isfinite(array).all():
                raise PassError(f"calibration sample {index} input {name!r} holds NaN or Inf; calibrate on real, "
                                "finite inputs (drop or repair the broken records)")
        try:
            bind_inputs(graph, feeds)
        except ExecutionError as e:
            raise PassError(f"calibration sample {index} does not fit graph {graph.name!r}: {e}") from e
        for name, value in _activations(graph, feeds, wanted).items():
            if not np.isfinite(value).all():
                raise PassError(f"activation {name!r} becomes NaN or Inf on calibration sample {index}; the model "
                                "overflows on this data, so fix the model or the samples before quantizing")
            if value.size == 0:
                continue
            if method == "minmax":
                lows[name].append(float(value.min()))
                highs[name].append(float(value.max()))
            else:
                lo, hi = np.percentile(value, [100.0 - percentile, percentile])
                lows[name].append(float(lo))
                highs[name].append(float(hi))
        count += 1
    if count == 0:
        raise PassError("no calibration samples; pass at least one batch of representative inputs "
                        "(an array for a single-input graph, or feed dicts)")
    combine = (min, max) if method == "minmax" else (lambda v: float(np.mean(v)),) * 2
    return {name: (combine[0](lows[name]) if lows[name] else 0.0, combine[1](highs[name]) if highs[name] else 0.0)
            for name in sorted(wanted)}


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
        for name, value in zip(node.outputs, results):
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


def quantize_int8(graph: Graph, ranges: Mapping[str, tuple[float, float]]) -> Graph:
    """The QDQ int8 form of ``graph``: int8 weights with per-channel scales and per-tensor QDQ on the
    activations entering Conv/Gemm/MatMul (plain or fused). ``ranges`` is what
    :func:`calibrate_ranges` returned for this graph.

    Raises:
        PassError: no quantizable op, an activation without a range, a range that is not a finite
            interval, or the result does not type-check / changed the graph's inputs or outputs.
    """
    sites = quantizable(graph)
    if not sites:
        raise _no_quantizable_ops(graph)
    missing = sorted({x for _, x, _, _ in sites if x not in ranges})
    if missing:
        raise PassError(f"no calibrated range for activations {missing}; run calibrate_ranges on this same graph "
                        "(after passes.optimize) and pass its result")
    taken, inits = all_names(graph), dict(graph.initializers)
    before: dict[int, list[Node]] = {}  # id(node) -> nodes to insert before it
    renamed: dict[int, str] = {}  # id(node) -> its new activation input
    activation: dict[str, str] = {}  # activation -> its dequantized name (one QDQ pair per value)
    weights: set[str] = set()
    for node, x, w, axis in sites:
        insert = before.setdefault(id(node), [])
        if w not in weights:  # the DequantizeLinear output takes the weight's name: readers need no change
            weights.add(w)
            q, scale = weight_scales(inits.pop(w), axis)
            qn, sn = fresh_name(taken, f"{_base(w)}.int8"), fresh_name(taken, f"{_base(w)}.scale")
            inits[qn], inits[sn] = q, scale
            insert.append(Node(fresh_name(taken, f"{w}.dequantize"), "DequantizeLinear", (qn, sn), (w,),
                               {"axis": axis}, QDQ_VERSION))
        if x not in activation:
            scale, zero = activation_params(*ranges[x])
            sn, zn = fresh_name(taken, f"{_base(x)}.scale"), fresh_name(taken, f"{_base(x)}.zero_point")
            qx, dx = fresh_name(taken, f"{x}.quantized"), fresh_name(taken, f"{x}.dequantized")
            inits[sn], inits[zn] = scale, zero
            insert.append(Node(fresh_name(taken, f"{x}.quantize"), "QuantizeLinear", (x, sn, zn), (qx,), {},
                               QDQ_VERSION))
            insert.append(Node(fresh_name(taken, f"{x}.dequantize"), "DequantizeLinear", (qx, sn, zn), (dx,), {},
                               QDQ_VERSION))
            activation[x] = dx
        renamed[id(node)] = activation[x]
    nodes: list[Node] = []
    for node in graph.nodes:
        nodes.extend(before.get(id(node), []))
        if id(node) in renamed:
            node = Node(node.name, node.op_type, (renamed[id(node)], *node.inputs[1:]), node.outputs, node.attrs,
                        node.version)
        nodes.append(node)
    return _finish(graph, nodes, inits)


# --- fp16 storage and the fold at load ------------------------------------------------------------
def store_fp16(graph: Graph) -> Graph:
    """``graph`` with its float32 weights stored as float16, each followed by a Cast to float32.

    Initializers under FP16_MIN_ELEMENTS elements, with values beyond float16's range, or that are
    also graph inputs stay float32.

    Raises:
        PassError: the result does not type-check or changed the graph's inputs or outputs.
    """
    inputs = {v.name for v in graph.inputs}
    taken, inits = all_names(graph), dict(graph.initializers)
    casts = []
    for name, array in graph.initializers.items():
        if (array.dtype != np.float32 or array.size < FP16_MIN_ELEMENTS or name in inputs
                or not np.isfinite(array).all() or float(np.abs(array).max()) > FP16_MAX):
            continue
        half = fresh_name(taken, f"{_base(name)}.fp16")
        inits[half] = inits.pop(name).astype(np.float16)
        casts.append(Node(fresh_name(taken, f"{name}.cast"), "Cast", (half,), (name,), {"to": FLOAT32_CODE}, 13))
    if not casts:
        return graph
    return _finish(graph, casts + list(graph.nodes), inits)


#: Ops whose output is a function of constants only, folded by :func:`dequantize_at_load`.
LOAD_FOLDS = ("DequantizeLinear", "Cast")


def dequantize_at_load(graph: Graph) -> Graph:
    """The agent-side fold for targets whose kernels compute in fp32: every DequantizeLinear or Cast
    that reads only initializers becomes the float initializer it computes (once, at load), so runs
    do not expand the weights again. Activation QuantizeLinear/DequantizeLinear pairs stay, so the
    result computes what the int8 graph does.

    Raises:
        PassError: a fold failed, or the result does not type-check.
    """
    inits = dict(graph.initializers)
    nodes = []
    for node in graph.nodes:
        args = [n for n in node.inputs if n]
        if node.op_type in LOAD_FOLDS and args and all(n in inits for n in args):
            try:
                result = ops.get(node.op_type, node.describe()).kernel(
                    node, *[inits[n] if n else None for n in node.inputs])[0]
            except Exception as e:
                raise PassError(f"dequantize at load: {node.describe()} failed: {type(e).__name__}: {e}") from e
            inits[node.outputs[0]] = np.ascontiguousarray(result)
            continue
        nodes.append(node)
    if len(nodes) == len(graph.nodes):
        return graph
    return _finish(graph, nodes, inits)


def _finish(graph: Graph, nodes: list[Node], inits: dict[str, np.ndarray]) -> Graph:
    """Rebuild with only the initializers still read (the package must not carry the old weights)."""
    read = {n for node in nodes for n in node.inputs} | {v.name for v in graph.outputs}
    try:
        out = rebuild(graph, nodes, {k: v for k, v in inits.items() if k in read})
        check_outputs_kept(graph, out)
    except CuvilError as e:
        raise PassError(f"quantization of graph {graph.name!r} produced an invalid graph: {e}") from e
    return out


__all__ = ["calibrate_ranges", "quantize_int8", "store_fp16", "dequantize_at_load", "quantizable",
           "weight_scales", "activation_params", "QUANTIZABLE", "FP16_MIN_ELEMENTS"]
