"""Compiled module vs onnxruntime vs torch eager, one thread, interleaved.

For each model (bench/compiled_models.py: MLP, the digits CNN, a 28x28 CNN, ResNet-18/50,
MobileNetV2, EfficientNet-B0, ConvNeXt-pico, a transformer encoder) the torch model is exported to
ONNX (TorchScript exporter, symbolic batch), imported with ``cuvil_edge.frontend.load_model``,
optimised with ``cuvil_edge.passes.optimize`` and built for ``x86-64`` into a fresh cache folder
(``build seconds`` covers load + optimise + a cold build). Then, at each batch size, the three
runtimes are timed round-robin in one process (each sample times the three one after another, the
order rotating per sample, so machine noise hits all alike): the compiled module's ``.run(feeds)``,
an onnxruntime CPU session (intra- and inter-op threads 1) and the torch module under
``torch.inference_mode()`` (``torch.set_num_threads(1)``); numpy's BLAS is held to one thread with
threadpoolctl. A sample is the mean of k back-to-back calls (k chosen per runtime in warm-up so a
sample lasts >= 2 ms: sub-millisecond models are not timed at the clock's resolution); reported are
the median and interquartile range over the samples, ratios of medians, and the compiled and torch
outputs' error against onnxruntime's.

The machine's ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` make OpenBLAS pick kernels that halve
sgemm speed, and OpenBLAS reads them when numpy loads: if either is set, this script re-executes
itself with both removed from the environment before importing numpy (the JSON records what was
removed).

    .venv/bin/python bench/bench_compiled.py                         # everything (~10 min on 2 cores)
    .venv/bin/python bench/bench_compiled.py --models mlp,resnet18 --batches 1 --samples 15
    .venv/bin/python bench/bench_compiled.py --models resnet18 --batches 1 --profile resnet18

``--profile MODEL[,MODEL]`` also times every node of the compiled module (a copy of the generated
``_forward`` with a clock read around the statements of each node, swapped into the module's
namespace) and onnxruntime's per-node kernel times (its own profiler), and prints and stores the
per-op-type breakdown. Results: bench/results/compiled.json and compiled.md (the full run writes
both; a run with --models/--batches/--samples writes compiled_quick.{json,md} unless --out is given).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _clean_env import STRIPPED as _STRIPPED, reexec_without_openblas_env, removed  # noqa: E402

if __name__ == "__main__":
    reexec_without_openblas_env(__file__)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compiled_models as cm  # noqa: E402
from _profile import layer_rows, print_profile, profile_compiled, profile_onnxruntime  # noqa: E402

from cuvil_edge.device_targets import build  # noqa: E402
from cuvil_edge.frontend import load_model  # noqa: E402
from cuvil_edge.frontend.demo_model import digits_cnn_onnx  # noqa: E402
from cuvil_edge.passes import optimize  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RUNTIMES = ("compiled", "onnxruntime", "torch")
SAMPLES_SMALL = 25  # per model and batch, after warm-up
SAMPLES_BIG_B16 = 15  # the 224x224-class models and the transformer at batch 16
MIN_SAMPLE_S = 0.002  # a sample is the mean of enough calls to last this long
WARMUP_CALLS = 3
PROFILE_RUNS = 15


class _Package:
    """What build() needs: the graph and a payload digest."""

    def __init__(self, graph, data: bytes) -> None:
        self.graph, self.payload_digest = graph, hashlib.sha256(data).hexdigest()


def export(name: str, model: torch.nn.Module) -> tuple[bytes, str]:
    """The model's ONNX (symbolic batch, traced at batch 2) and its input's name."""
    if name == "digits_cnn":
        return digits_cnn_onnx(), "image"
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(cm.example(name, 2)),), buffer, dynamo=False,
                          opset_version=cm.SPECS[name].opset, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return buffer.getvalue(), "x"


def ort_session(data: bytes, profile: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def calls_per_sample(fn: Callable[[], object]) -> int:
    """Warm ``fn`` up (after the one call that produced the outputs compared); the number of calls one
    sample needs to last MIN_SAMPLE_S. A call over half a second is warm after one more call."""
    elapsed: list[float] = []
    while len(elapsed) < WARMUP_CALLS and not (elapsed and min(elapsed) > 0.5):
        start = time.perf_counter()
        fn()
        elapsed.append(time.perf_counter() - start)
    return max(1, int(np.ceil(MIN_SAMPLE_S / max(min(elapsed), 1e-7))))


def time_interleaved(fns: dict[str, Callable[[], object]], samples: int) -> dict[str, dict]:
    """Per runtime: median and IQR (ms per call) over ``samples`` round-robin samples."""
    calls = {k: calls_per_sample(f) for k, f in fns.items()}
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for s in range(samples):
        for k in order[s % len(order):] + order[:s % len(order)]:
            f, n = fns[k], calls[k]
            start = time.perf_counter()
            for _ in range(n):
                f()
            times[k].append((time.perf_counter() - start) / n * 1e3)
    out = {}
    for k, ts in times.items():
        q1, med, q3 = np.percentile(ts, [25, 50, 75])
        out[k] = {"ms": float(med), "iqr_ms": float(q3 - q1), "min_ms": float(min(ts)), "calls_per_sample": calls[k]}
    return out


def errors(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """max |got - want| and that over max |want| (relative to the output's scale: an elementwise
    ratio is dominated by outputs near zero)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return {"max_abs_err": float("nan"), "max_rel_err": float("nan"), "shape_mismatch": True}
    diff = float(np.max(np.abs(got - want)))
    return {"max_abs_err": diff, "max_rel_err": diff / max(float(np.max(np.abs(want))), 1e-30)}


# ---------------------------------------------------------------- driver


def bench_model(name: str, batches: list[int], samples: int | None, profile: bool, cache: Path) -> dict:
    spec = cm.SPECS[name]
    model = cm.make(name)
    data, input_name = export(name, model)
    start = time.perf_counter()
    graph = load_model(data)
    optimized, _ = optimize(graph)
    compiled = build(_Package(optimized, data), "x86-64", cache_dir=cache / name)
    build_s = time.perf_counter() - start
    session = ort_session(data)
    entry: dict = {"title": spec.title, "input_shape": list(spec.shape), "opset": spec.opset,
                   "onnx_nodes": len(graph.nodes), "optimised_nodes": len(optimized.nodes),
                   "build_s": build_s, "build_only_s": compiled.build_seconds, "batches": {}}
    print(f"{name}: {spec.title}, {len(graph.nodes)} -> {len(optimized.nodes)} nodes, built in {build_s:.2f} s",
          flush=True)
    with torch.inference_mode():
        for batch in batches:
            x = cm.example(name, batch, seed=batch)
            xt = torch.from_numpy(x)
            feeds = {input_name: x}
            want = session.run(None, feeds)[0]
            got = compiled.run(feeds)[compiled.graph.outputs[0].name]
            theirs = model(xt).numpy()
            n = samples if samples is not None else (SAMPLES_BIG_B16 if spec.big and batch > 1 else SAMPLES_SMALL)
            t = time_interleaved({"compiled": lambda: compiled.run(feeds),
                                  "onnxruntime": lambda: session.run(None, feeds),
                                  "torch": lambda: model(xt)}, n)
            row = {"samples": n, **{f"{k}_ms": v["ms"] for k, v in t.items()},
                   **{f"{k}_iqr_ms": v["iqr_ms"] for k, v in t.items()},
                   **{f"{k}_min_ms": v["min_ms"] for k, v in t.items()},
                   "calls_per_sample": {k: v["calls_per_sample"] for k, v in t.items()},
                   "compiled_vs_onnxruntime": t["compiled"]["ms"] / t["onnxruntime"]["ms"],
                   "compiled_vs_torch": t["compiled"]["ms"] / t["torch"]["ms"],
                   # ratios of the fastest samples: less sensitive to other work on a shared machine
                   "compiled_vs_onnxruntime_min": t["compiled"]["min_ms"] / t["onnxruntime"]["min_ms"],
                   "compiled_vs_torch_min": t["compiled"]["min_ms"] / t["torch"]["min_ms"],
                   "compiled_err_vs_onnxruntime": errors(got, want),
                   "torch_err_vs_onnxruntime": errors(theirs, want)}
            entry["batches"][str(batch)] = row
            print(f"  b={batch:<3d} compiled {row['compiled_ms']:9.3f} ms  onnxruntime {row['onnxruntime_ms']:9.3f} ms"
                  f"  torch {row['torch_ms']:9.3f} ms  vs ORT {row['compiled_vs_onnxruntime']:5.2f}x"
                  f"  vs torch {row['compiled_vs_torch']:5.2f}x"
                  f"  rel err {row['compiled_err_vs_onnxruntime']['max_rel_err']:.1e}  ({n} samples)", flush=True)
    if profile:
        batch = 1
        feeds = {input_name: cm.example(name, batch, seed=batch)}
        profiled = ort_session(data, profile=True)
        profiled.run(None, feeds)  # warm-up, like the compiled module's
        ours = profile_compiled(compiled, feeds, optimized, batch, PROFILE_RUNS, lambda: profiled.run(None, feeds))
        entry["profile"] = {"compiled": ours, "onnxruntime": profile_onnxruntime(profiled, optimized, PROFILE_RUNS + 1)}
        print_profile(name, entry["profile"])
    return entry


def machine_note() -> dict:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for i in threadpool_info() if i.get("user_api") == "blas"]
    import cuvil_edge
    root = Path(cuvil_edge.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "cuvil_edge"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "?", None
    return {"cpu": cpu, "cores": os.cpu_count(), "cuvil_edge_commit": commit, "cuvil_edge_uncommitted_changes": dirty,
            "python": platform.python_version(), "numpy": np.__version__,
            "onnxruntime": ort.__version__, "torch": torch.__version__, "blas": blas,
            "removed_env": removed(),
            "openblas_env_now": {k: os.environ.get(k) for k in _STRIPPED}}


def write_markdown(results: dict, path: Path) -> None:
    m = results["machine"]
    blas = ", ".join(f"{b['internal_api']} {b['version']} {b['architecture']}" for b in m["blas"])
    lines = [
        "# Compiled module vs onnxruntime vs torch eager (one thread)",
        "",
        f"Command: `{results['command']}`  ",
        f"Machine: {m['cpu']}, {m['cores']} cores (shared with other work), Python {m['python']}, numpy {m['numpy']} "
        f"({blas}), "
        f"onnxruntime {m['onnxruntime']}, torch {m['torch']}. "
        "The script re-executes itself without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (this machine sets them; "
        "they make OpenBLAS pick kernels that halve sgemm speed, and must be unset before numpy loads); "
        f"removed this run: {m['removed_env'] or 'none were set'}.  ",
        f"Date: {results['date']}; wall time {results['wall_s']:.0f} s; cuvil_edge at commit {m['cuvil_edge_commit']}"
        f"{' with uncommitted changes' if m['cuvil_edge_uncommitted_changes'] else ''}.",
        "",
        "One thread everywhere (threadpoolctl BLAS limit 1, onnxruntime intra/inter-op 1, "
        "`torch.set_num_threads(1)`); the three runtimes timed round-robin per sample in one process. "
        "ms = median per call over the samples (a sample is the mean of enough back-to-back calls to last "
        f">= {MIN_SAMPLE_S * 1e3:g} ms; warm-up: the call whose outputs are compared, then 1-{WARMUP_CALLS} "
        "calibration calls), ± = interquartile range. Samples: {SAMPLES_SMALL} per row, "
        f"{SAMPLES_BIG_B16} for the 224x224 models and the transformer at batch 16 (unless --samples). "
        "Ratios are of medians; \"of minima\" divides the fastest samples (less sensitive to other work on "
        "this shared machine). rel err = max |compiled - onnxruntime| / max |onnxruntime| over the output. "
        "build = load_model + optimize + a cold build for x86-64. Random weights, BatchNorm statistics "
        "randomised, eval mode; exported by torch.onnx.export(dynamo=False) at opset 17 (the digits CNN: "
        "cuvil_edge.frontend.demo_model, opset 13).",
        "",
        "Models (bench/compiled_models.py): torchvision layouts written out (torchvision is not installed), "
        "1000 classes. ResNet-50 is v1.5 (stride in the 3x3). EfficientNet-B0 (SiLU, squeeze-excite, depthwise "
        "3x3/5x5). The ConvNeXt-style network is timm's ConvNeXt-pico (dims 64-128-256-512, depths 2-2-6-2, "
        "7x7 depthwise, LayerNorm over channels via permute, GELU, layer scale), not -tiny, so that batch 16 "
        "fits the run's time budget. The transformer: 4 pre-norm layers, width 256, 8 heads, MLP 1024, "
        "over (batch, 128, 256) embeddings; torch exports its GELU at opset 17 as Div/Erf/Add/Mul.",
        "",
        "| model | batch | onnxruntime ms | torch ms | compiled ms | compiled/ORT | compiled/torch "
        "| /ORT, /torch of minima | rel err | build s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in results["models"].items():
        for batch, r in e["batches"].items():
            lines.append(
                f"| {e['title']} | {batch} | {r['onnxruntime_ms']:.3f} ± {r['onnxruntime_iqr_ms']:.3f} "
                f"| {r['torch_ms']:.3f} ± {r['torch_iqr_ms']:.3f} "
                f"| {r['compiled_ms']:.3f} ± {r['compiled_iqr_ms']:.3f} "
                f"| {r['compiled_vs_onnxruntime']:.2f}× | {r['compiled_vs_torch']:.2f}× "
                f"| {r['compiled_vs_onnxruntime_min']:.2f}×, {r['compiled_vs_torch_min']:.2f}× "
                f"| {r['compiled_err_vs_onnxruntime']['max_rel_err']:.1e} | {e['build_s']:.2f} |")
    for name, e in results["models"].items():
        if "profile" not in e:
            continue
        c = e["profile"]["compiled"]
        lines += ["", f"## Profile: {e['title']}, batch {c['batch']}", "",
                  f"Compiled run {c['run_ms_plain']:.2f} ms ({c['run_ms_instrumented']:.2f} ms with a clock read "
                  f"around each node; {c['unattributed_ms']:.2f} ms outside the nodes). Per node the median over "
                  f"{c['runs']} runs; shares are of the nodes' sum ({c['nodes_ms']:.2f} ms). ↳ rows split the "
                  "convolutions by kind (depthwise / 1x1 / kxk, /stride). GFLOP/s from cuvil_edge.ir.cost.",
                  "", "| op type | nodes | ms | share | GFLOP/s |", "|---|---|---|---|---|"]
        for op, t in c["by_op_type"].items():
            rate = f"{t['gflops_per_s']:.1f}" if t["gflops_per_s"] else ""
            lines.append(f"| {op} | {t['count']} | {t['ms']:.3f} | {t['share']:.1%} | {rate} |")
        for op, t in c["by_kind"].items():
            if "Conv" in op:
                rate = f"{t['gflops_per_s']:.1f}" if t["gflops_per_s"] else ""
                lines.append(f"| ↳ {op} | {t['count']} | {t['ms']:.3f} | {t['share']:.1%} | {rate} |")
        lines += ["", "onnxruntime's kernels (its profiler, ms per run): " + ", ".join(
            f"{op} {t['ms']:.3f} ({t['count']})" for op, t in e["profile"]["onnxruntime"]["by_op_type"].items())]
        rows = layer_rows(e["profile"])
        if rows:
            lines += ["", "Convolution layers, ours against onnxruntime's profiler (its node names are the values "
                      "they write; residual convolutions add the shortcut and apply the Relu in both: ours are "
                      "CuvilConvAdd). GFLOP/s of the same FLOPs.", "",
                      "| layer | n | ours ms | ours GFLOP/s | ORT ms | ORT GFLOP/s | ours / ORT |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['layer']} | {r['count']} | {r['ms']:.3f} | {r['gflops_per_s']:.1f} | {r['ort_ms']:.3f} "
                      f"| {r['ort_gflops_per_s']:.1f} | {r['of_ort']:.0%} |" for r in rows]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(cm.SPECS), help=f"comma-separated, of {','.join(cm.SPECS)}")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--samples", type=int, default=None,
                        help=f"samples per row (default {SAMPLES_SMALL}; {SAMPLES_BIG_B16} for the big models "
                             "at batch > 1)")
    parser.add_argument("--profile", default="", help="comma-separated models to profile per op type (batch 1)")
    parser.add_argument("--out", default=None,
                        help="output stem under bench/results (default: compiled, or compiled_quick when "
                             "--models/--batches/--samples narrow the run)")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models + [p for p in args.profile.split(",") if p] if m not in cm.SPECS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(cm.SPECS)}")
    profiles = {p for p in args.profile.split(",") if p}
    models += [p for p in profiles if p not in models]
    batches = [int(b) for b in args.batches.split(",") if b]
    full = args.models == parser.get_default("models") and args.batches == "1,16" and args.samples is None
    stem = args.out or ("compiled" if full else "compiled_quick")

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    started = time.perf_counter()
    results: dict = {"command": "python bench/bench_compiled.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
                     "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_note(), "models": {}}
    with threadpool_limits(1), tempfile.TemporaryDirectory() as cache:
        results["machine"]["blas"] = machine_note()["blas"]
        for name in models:
            results["models"][name] = bench_model(name, batches, args.samples, name in profiles, Path(cache))
    results["wall_s"] = time.perf_counter() - started
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, RESULTS / f"{stem}.md")
    print(f"\nwrote {RESULTS / (stem + '.json')} and .md in {results['wall_s']:.0f} s")
    return results


if __name__ == "__main__":
    main()
