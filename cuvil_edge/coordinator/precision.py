"""The precision a package carries: fp32 as optimized, fp16 weight storage, or
int8 QDQ calibrated on sample inputs the coordinator provides (`passes.quantize`).

Calibration samples come from an ``.npz`` file (``--calibration``): one array per model input,
named as the input, samples along the first axis (a single-input model may name its array
anything). It is read with ``allow_pickle=False``: a calibration file never runs code. Without
one, int8 is calibrated on standard-normal inputs of the model's input shape, and the package's
note says so: the ranges then fit random data, not the sites' records.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from cuvil_edge.errors import ConfigError
from cuvil_edge.ir.graph import Graph

PRECISIONS = ("fp32", "fp16", "int8")
#: Samples per calibration batch, and batches drawn when no samples are given.
BATCH, SYNTHETIC_BATCHES = 32, 4


def load_calibration(path: Path, graph: Graph) -> list[dict[str, np.ndarray]]:
    """Calibration batches (feed dicts of at most :data:`BATCH` samples) from an ``.npz`` file.

    Raises:
        ConfigError: the file is missing or not an npz of plain arrays, its names do not match the
            model's inputs, the inputs hold different sample counts, or it holds no sample.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: np.asarray(data[name]) for name in data.files}
    except FileNotFoundError:
        raise ConfigError(f"{path}: calibration file not found") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ConfigError(f"{path}: not a calibration .npz of plain arrays ({e}); save one with numpy.savez") from e
    inputs = [v.name for v in graph.inputs]
    if len(inputs) == 1 and len(arrays) == 1:
        arrays = {inputs[0]: next(iter(arrays.values()))}
    return calibration_batches(arrays, graph, str(path))


def calibration_batches(arrays: Mapping[str, np.ndarray], graph: Graph, where: str) -> list[dict[str, np.ndarray]]:
    """Samples (one array per model input, samples along axis 0) as calibration batches of at most
    :data:`BATCH`; ``where`` names their source in errors.

    Raises:
        ConfigError: the names do not match the model's inputs, the inputs hold different sample
            counts, or they hold no sample.
    """
    inputs = [v.name for v in graph.inputs]
    if sorted(arrays) != sorted(inputs):
        raise ConfigError(
            f"{where}: holds arrays {sorted(arrays)}, but the model's inputs are {inputs}; name one array per input"
        )
    counts = {name: (a.shape[0] if a.ndim else 0) for name, a in arrays.items()}
    if len(set(counts.values())) != 1 or not next(iter(counts.values())):
        raise ConfigError(f"{where}: every input needs the same, non-zero number of samples along axis 0, got {counts}")
    total = next(iter(counts.values()))
    return [{name: a[start : start + BATCH] for name, a in arrays.items()} for start in range(0, total, BATCH)]


def federation_calibration(calibration: Path | None, graph: Graph) -> list[dict[str, np.ndarray]] | None:
    """The federation file's ``quantization.calibration`` samples (None when it gives none: int8 is
    then not offered to any site)."""
    return None if calibration is None else load_calibration(calibration, graph)


def synthetic_calibration(graph: Graph, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Standard-normal batches shaped like the model's inputs (symbolic dims as :data:`BATCH`).

    Raises:
        ConfigError: an input is not floating point (its values cannot be made up).
    """
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(SYNTHETIC_BATCHES):
        feeds = {}
        for value in graph.inputs:
            if value.type.dtype not in ("float16", "float32", "float64"):
                raise ConfigError(
                    f"input {value.name!r} is {value.type.dtype}: int8 needs --calibration samples "
                    "for it (an .npz with one array per input)"
                )
            shape = tuple(BATCH if isinstance(d, str) else d for d in value.type.shape)
            feeds[value.name] = rng.standard_normal(shape).astype(value.type.dtype)
        batches.append(feeds)
    return batches


def with_precision(
    graph: Graph, precision: str, calibration: Sequence[Mapping[str, np.ndarray]] | None = None, method: str = "mse"
) -> tuple[Graph, str]:
    """``graph`` (optimized) as a ``precision`` package carries it, and a note for the report.

    int8: activation ranges by ``method`` (``mse`` searches each tensor's range for the least
    rounding-plus-clipping error), weights rounded by GPTQ on the same samples, and the ops that
    read a model input directly (a first conv on raw pixels: white inputs no rounding scheme helps,
    and few weights) kept in float (bench/results/quantization.md).

    Raises:
        ConfigError: an unknown precision, or int8 of a model with non-float inputs and no samples.
        PassError: quantization failed (no quantizable op, non-finite samples ...; it says which).
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    from cuvil_edge.passes.quantize import calibrate_ranges, quantizable, quantize_int8, store_fp16

    if precision == "fp32":
        return graph, "fp32 weights"
    if precision == "fp16":
        return store_fp16(graph), "fp16 weight storage; a target computing in fp32 widens them once at load"
    from cuvil_edge.passes import split_fused_blocks

    graph = split_fused_blocks(graph)  # int8 quantizes convolutions one by one; a fused block would stay float
    samples = calibration if calibration is not None else synthetic_calibration(graph)
    source = (
        f"{sum(len(next(iter(b.values()))) for b in samples)} calibration samples"
        if calibration is not None
        else "standard-normal inputs (no --calibration given: ranges fit random data, not real records)"
    )
    sites = quantizable(graph)
    inputs = {v.name for v in graph.inputs}
    first = [node.name for node, x, _, _ in sites if x in inputs]
    keep = first if len(first) < len(sites) else []  # a model that is one layer is quantized whole
    quantized = quantize_int8(graph, calibrate_ranges(graph, samples, method), samples=samples, keep_float=keep)
    kept = f"; {', '.join(keep)} kept in float (reads the model input)" if keep else ""
    return quantized, (
        f"int8 weights (per channel, GPTQ rounding) and activations (per tensor, {method} over "
        f"{source}){kept}; dequantized once at load on targets that compute in fp32"
    )
