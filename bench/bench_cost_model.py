"""Cost model vs measurement on this host.

Calibrates this host in-process (:func:`cuvil_edge.device_targets.calibrate.calibrate`, based on
x86-64, one thread), then for each model (bench/compiled_models.py's nine and five architecture
exports from tests/architectures) at batch 1 and 16: predicts the compiled latency for the
calibrated ``host`` spec (:func:`cost_model.predict`; the host is recalibrated after each model, and
a model's prediction is the geometric mean of those with the calibrations just before and just after
its measurement, since this shared machine's load drifts within minutes), builds the module and measures
``.run(feeds)`` (the fastest of 7 samples, each the mean of enough calls to last >= 5 ms, in CPU
time, as calibrate times its probes: the machine is shared, wall time would count other processes'
slices and their cache traffic slows this one's CPU time too; CPU and wall medians are kept in the
JSON, with the MAPE against the CPU medians). Reports the
graph-level Spearman rank correlation and mean absolute percentage error, and per node on ResNet-18,
MobileNetV2 and the transformer (batch 1): each node's time measured by a copy of the generated
``_forward`` with a clock read around each node's statements (bench_compiled's instrumentation),
against its prediction.

Like bench_compiled.py, the script re-executes itself without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE
(they make OpenBLAS pick slower kernels, and must be unset before numpy loads).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_cost_model.py  # ~3-6 min on 2 cores
    .venv/bin/python bench/bench_cost_model.py --models mlp,resnet18 --out cost_model_quick

Results: bench/results/cost_model.{json,md,png}.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _clean_env import reexec_without_openblas_env, removed  # noqa: E402

if __name__ == "__main__":
    reexec_without_openblas_env(__file__)

import argparse  # noqa: E402
import ast  # noqa: E402
import hashlib  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "architectures"))
import bench_compiled as bc  # noqa: E402
import compiled_models as cm  # noqa: E402

from cuvil_edge.device_targets import build  # noqa: E402
from cuvil_edge.device_targets.calibrate import CLOCK, calibrate  # noqa: E402
from cuvil_edge.device_targets.cost_model import predict  # noqa: E402
from cuvil_edge.frontend import load_model  # noqa: E402
from cuvil_edge.passes import optimize  # noqa: E402

RESULTS = HERE / "results"
EXPORTS = ("vit", "mobilenetv3", "groupnorm_cnn", "alexnet_lrn", "bert")  # tests/architectures/export_models.py
PER_NODE = ("resnet18", "mobilenetv2", "transformer")
SAMPLES, MIN_SAMPLE_S, PROFILE_RUNS = 7, 0.005, 9
#: small models keep sampling (up to MAX_SAMPLES) until MIN_SPAN_S of CPU time: a burst of other work on
#: this shared machine lasts longer than 7 samples of 5 ms, and the fastest sample should be undisturbed
MIN_SPAN_S, MAX_SAMPLES = 0.3, 40
TARGETS = {"graph_spearman": 0.95, "graph_mape": 0.20, "node_spearman": 0.9}


def load(name: str) -> tuple[object, bytes, callable]:
    """(optimised graph, onnx bytes, feeds(batch)) of a bench model or an architecture export."""
    if name in cm.SPECS:
        data, input_name = bc.export(name, cm.make(name))
        feeds = lambda batch: {input_name: cm.example(name, batch, seed=batch)}  # noqa: E731
    else:
        import test_exports as te  # imports torch and onnxruntime: only when an export is asked for

        data = te.exported(name)
        feeds = lambda batch: te.EXPORTS[name].feeds(batch, np.random.default_rng(batch))  # noqa: E731
    graph, _ = optimize(load_model(data))
    return graph, data, feeds


def measure(fn) -> tuple[float, float, float]:
    """(fastest CPU seconds, median CPU seconds, median wall seconds) per call over SAMPLES samples
    (more, up to MAX_SAMPLES, until MIN_SPAN_S of CPU time), each >= MIN_SAMPLE_S (after warm-up).
    The fastest CPU-time sample is what the model is checked against, as calibrate times its probes:
    on this shared machine wall time also counts the slices other processes get, and their cache and
    memory traffic slows this process's CPU time too."""
    fn()
    start = CLOCK()
    fn()
    calls = max(1, int(np.ceil(MIN_SAMPLE_S / max(CLOCK() - start, 1e-7))))
    cpu, wall = [], []
    begun = CLOCK()
    while len(cpu) < SAMPLES or (CLOCK() - begun < MIN_SPAN_S and len(cpu) < MAX_SAMPLES):
        start, start_wall = CLOCK(), time.perf_counter()
        for _ in range(calls):
            fn()
        cpu.append((CLOCK() - start) / calls)
        wall.append((time.perf_counter() - start_wall) / calls)
    return float(np.min(cpu)), float(np.median(cpu)), float(np.median(wall))


def profile_nodes(compiled, feeds) -> dict[tuple[str, ...], float]:
    """Fastest seconds per group of nodes (usually one node) over PROFILE_RUNS runs, from a copy of
    the module's ``_forward`` with clock reads around each node's statements."""
    namespace = compiled._entry.__globals__
    tree = ast.parse(compiled.source)
    function = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "_forward")
    timed, groups = bc._instrumented(compiled.source, function)
    acc, row = np.zeros((PROFILE_RUNS, len(groups))), [0]
    original = namespace["_forward"]
    namespace["_cuv_clock"] = CLOCK
    namespace["_cuv_record"] = lambda i, s: acc.__setitem__((row[0], i), acc[row[0], i] + s)
    try:
        exec(compile(ast.Module(body=[timed], type_ignores=[]), str(compiled.source_path), "exec"), namespace)
        compiled.run(feeds)
        for r in range(PROFILE_RUNS):
            row[0] = r
            compiled.run(feeds)
    finally:
        namespace["_forward"] = original
    out = {}
    for group, seconds in zip(groups, np.min(acc, axis=0)):
        if not group["node"]:
            continue
        names = ast.literal_eval(group["node"])
        out[tuple(names) if isinstance(names, tuple) else (names,)] = float(seconds)
    return out


def bench(name: str, batches: list[int], spec, cache: Path, per_node: bool) -> tuple[object, dict]:
    """(graph, measurements): each batch's compiled latency and, for ``per_node``, each node's at batch 1."""
    graph, data, feeds_of = load(name)
    compiled = build(_Package(graph, data), spec, cache_dir=cache / name)
    raw: dict = {"batches": {}}
    for batch in batches:
        feeds = feeds_of(batch)
        raw["batches"][batch] = measure(lambda: compiled.run(feeds))
    if per_node:
        raw["nodes"] = profile_nodes(compiled, feeds_of(1))
    return graph, raw


def predicted(graph, specs: list, batch: int) -> tuple[float, dict[str, object], int]:
    """(seconds, per-node seconds and labels, FLOPs) predicted for ``batch``: the geometric mean over
    ``specs``, the calibrations made just before and just after the model was measured (this shared
    machine's load drifts within the seconds between them)."""
    runs = [predict(graph, spec, batch=batch) for spec in specs]
    mean = lambda values: float(np.exp(np.mean(np.log(np.maximum(values, 1e-12)))))  # noqa: E731
    nodes = {n.node: (n, mean([r.nodes[i].seconds for r in runs])) for i, n in enumerate(runs[0].nodes)}
    return mean([r.seconds for r in runs]), nodes, runs[0].flops


def entry_of(name: str, graph, raw: dict, specs: list) -> dict:
    entry = {"nodes": len(graph.nodes), "batches": {}}
    for batch, (seconds, median, wall) in raw["batches"].items():
        total, _, flops = predicted(graph, specs, batch)
        entry["batches"][str(batch)] = {"predicted_ms": total * 1e3, "measured_ms": seconds * 1e3,
                                        "measured_median_ms": median * 1e3, "measured_wall_ms": wall * 1e3,
                                        "gflop": flops / 1e9, "error": total / seconds - 1}
        print(f"  {name:<14} b={batch:<3d} predicted {total * 1e3:10.3f} ms  measured "
              f"{seconds * 1e3:10.3f} ms  ({total / seconds - 1:+.0%})", flush=True)
    if "nodes" in raw:
        _, prediction, _ = predicted(graph, specs, 1)
        rows = []
        for names, seconds in raw["nodes"].items():
            nodes = [prediction[n] for n in names if n in prediction]
            rows.append({"nodes": list(names), "op_type": "+".join(n.op_type for n, _ in nodes),
                         "kernel": "+".join(n.kernel for n, _ in nodes), "bound": nodes[0][0].bound if nodes else "",
                         "predicted_ms": sum(t for _, t in nodes) * 1e3, "measured_ms": seconds * 1e3})
        rho = spearmanr([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows]).statistic
        entry["per_node"] = {"spearman": float(rho), "rows": rows}
        print(f"  {name}: per-node Spearman {rho:.3f} over {len(rows)} nodes", flush=True)
    return entry


class _Package:
    def __init__(self, graph, data: bytes) -> None:
        self.graph, self.payload_digest = graph, hashlib.sha256(data).hexdigest()


def summarise(models: dict) -> dict:
    pairs = [(r["predicted_ms"], r["measured_ms"]) for e in models.values() for r in e["batches"].values()]
    p, m = np.array(pairs).T
    nodes = {k: e["per_node"]["spearman"] for k, e in models.items() if "per_node" in e}
    med = np.array([r.get("measured_median_ms", r["measured_ms"]) for e in models.values()
                    for r in e["batches"].values()])
    s = {"points": len(pairs), "graph_spearman": float(spearmanr(p, m).statistic),
         "graph_mape": float(np.mean(np.abs(p - m) / m)), "graph_mape_vs_median": float(np.mean(np.abs(p - med) / med)),
         "node_spearman": nodes,
         "node_spearman_min": min(nodes.values()) if nodes else None}
    s["targets_met"] = {"graph_spearman": s["graph_spearman"] >= TARGETS["graph_spearman"],
                        "graph_mape": s["graph_mape"] <= TARGETS["graph_mape"],
                        "node_spearman": bool(nodes) and s["node_spearman_min"] >= TARGETS["node_spearman"]}
    return s


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    ax = axes[0]
    for batch, marker in (("1", "o"), ("16", "s")):
        pts = [(r["measured_ms"], r["predicted_ms"], k) for k, e in results["models"].items()
               for b, r in e["batches"].items() if b == batch]
        if pts:
            ax.scatter([q[0] for q in pts], [q[1] for q in pts], marker=marker, label=f"batch {batch}")
            for x, y, k in pts:
                ax.annotate(k, (x, y), fontsize=6, alpha=0.7)
    s = results["summary"]
    ax.set_title(f"graphs: Spearman {s['graph_spearman']:.3f}, MAPE {s['graph_mape']:.1%}")
    ax2 = axes[1]
    for name, e in results["models"].items():
        if "per_node" in e:
            rows = e["per_node"]["rows"]
            ax2.scatter([r["measured_ms"] for r in rows], [r["predicted_ms"] for r in rows], s=8,
                        label=f"{name} (ρ {e['per_node']['spearman']:.2f})")
    ax2.set_title("nodes (batch 1)")
    for a in axes:
        a.set_xscale("log")
        a.set_yscale("log")
        lo, hi = a.get_xlim()
        a.plot([lo, hi], [lo, hi], "k--", lw=0.7)
        a.set_xlabel("measured ms")
        a.set_ylabel("predicted ms")
        a.legend(fontsize=7)
    fig.suptitle(f"cost model vs measurement on {results['environment']['cpu']} (one thread)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def git_commit() -> str:
    """The checkout's HEAD (short), read when the run starts: the code the run measures."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def history(path: Path, results: dict) -> list[dict]:
    """The runs recorded in the previous results at ``path`` (same model set), then this one: how far
    the same command's figures move between runs on this shared machine."""
    try:
        previous = json.loads(path.read_text()).get("history", [])
    except (OSError, ValueError):
        previous = []
    s = results["summary"]
    run = {"date": results["environment"]["date"], "commit": results.get("commit", ""),
           "models": len(results["models"]),
           "graph_mape": round(s["graph_mape"], 4), "graph_spearman": round(s["graph_spearman"], 4),
           "node_spearman": {k: round(v, 3) for k, v in s["node_spearman"].items()},
           "load_start": results["load_average"]["start"][0], "wall_s": round(results["wall_s"])}
    return [r for r in previous if r.get("models") == run["models"]][-9:] + [run]


def write_markdown(results: dict, path: Path) -> None:
    s, env, spec = results["summary"], results["environment"], results["spec"]
    ok = lambda b: "met" if b else "NOT met"  # noqa: E731
    lines = ["# Cost model vs measurement (one thread)", "",
             f"Command: `{results['command']}`  ",
             f"Machine: {env['cpu']}, {env['cores']} cores (shared with other work), numpy {env['numpy']}; "
             f"OpenBLAS env: {env['openblas_env']}; removed by the script: {results['removed_env'] or 'none'}.  ",
             f"Date: {env['date']}; wall time {results['wall_s']:.0f} s.", "",
             "The host was calibrated in-process (`calibrate(base='x86-64')`)"
             + (", again after each model (this 2-core machine is shared, and its load drifts within minutes): "
                "each model is predicted with the calibrations just before and just after its measurement (the "
                "geometric mean of the two predictions; its row names both specs' digests)"
                if results["recalibrate"] else "")
             + "; the first spec: "
             + ", ".join(f"{k} {v}" for k, v in spec.items() if k not in ("description", "dtypes")) + ".", "",
             f"**Graph level** ({s['points']} points: {len(results['models'])} models x batch 1 and 16): Spearman "
             f"**{s['graph_spearman']:.3f}** (target ≥ {TARGETS['graph_spearman']}: {ok(s['targets_met']['graph_spearman'])}), "
             f"MAPE **{s['graph_mape']:.1%}** (target ≤ {TARGETS['graph_mape']:.0%}: {ok(s['targets_met']['graph_mape'])}).  ",
             "**Per node** (batch 1; Spearman over the nodes' predicted vs measured ms): "
             + ", ".join(f"{k} **{v:.3f}**" for k, v in s["node_spearman"].items())
             + f" (target ≥ {TARGETS['node_spearman']}: {ok(s['targets_met']['node_spearman'])}).", "",
             "measured = the fastest of %d or more samples (CPU time, over >= 0.3 s), each the mean of enough calls to last ≥ %g ms, "
             "as calibrate times its probes (the least disturbed by other processes); against the CPU-time "
             "medians instead, MAPE %.1f%%." % (SAMPLES, MIN_SAMPLE_S * 1e3, 100 * s["graph_mape_vs_median"]), "",
             "| model | nodes | batch | GFLOP | predicted ms | measured ms (CPU) | error | wall ms | spec |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, e in results["models"].items():
        for batch, r in e["batches"].items():
            lines.append(f"| {name} | {e['nodes']} | {batch} | {r['gflop']:.3f} | {r['predicted_ms']:.3f} "
                         f"| {r['measured_ms']:.3f} | {r['error']:+.1%} | {r['measured_wall_ms']:.3f} "
                         f"| {e.get('spec_digest', '')} |")
    for name, e in results["models"].items():
        if "per_node" in e:
            rows = sorted(e["per_node"]["rows"], key=lambda r: -r["measured_ms"])
            lines += ["", f"## Per node: {name} (batch 1), Spearman {e['per_node']['spearman']:.3f}, top 12 by time",
                      "", "| node | op | kernel | bound | predicted ms | measured ms |", "|---|---|---|---|---|---|"]
            lines += [f"| {', '.join(r['nodes'])[:60]} | {r['op_type']} | {r['kernel']} | {r['bound']} "
                      f"| {r['predicted_ms']:.3f} | {r['measured_ms']:.3f} |" for r in rows[:12]]
    load = results.get("load_average", {})
    lines += ["", "## How the model predicts, and what limits it", "",
              "* Per-kernel terms come from `cuvil-edge calibrate`'s micro-benchmarks on synthetic shapes (spec "
              "`kernel_ns`, device_targets/cost_kernels.py), never from these models: sgemm as flop + packing + "
              "call over 40 log-uniform shapes with operands cycled out of L2; one-row products as sgemv (per "
              "matrix element and call); the further products of one batched np.matmul (attention's MatMuls, a "
              "weight broadcast over a batch of images) without numpy's call; the native depthwise kernel per "
              "plane, padded element and tap, with its strided row loop apart (7-9x the stride-1 cost per tap); "
              "the native max pooling's own compare-and-select loop; the native Softmax's scalar remainder of "
              "rows off the 16-lane SIMD width (12- and 17-wide attention rows: 4-6x a 16-wide row); the im2col "
              "copy; numpy reductions; the native LayerNorm; the fresh pages of arrays past glibc's 32 MiB mmap "
              "limit (batch 16). Per-call costs per kernel kind come from chains of small probes timed in "
              "interleaved rounds (the native LayerNorm apart from the other native calls; the numpy window "
              "loop per tap, np.pad per call), the run's own cost is at least run() around the generated "
              "_forward, and a kernel's epilogue calls (bias, activation) are counted.",
              f"* This 2-core machine is shared: load average {load.get('start', '?')} at the start, "
              f"{load.get('end', '?')} at the end of this run. Both sides take the fastest CPU-time sample; "
              "the same model's time still moves by 10-40 % between runs minutes apart, more for the small "
              "per-call-bound models (ViT, BERT, GroupNorm CNN, AlexNet-LRN, MobileNetV3, MLP).",
              "* Known gaps: the sgemm fit's error on its own grid is ~20 % per shape (OpenBLAS switches kernels "
              "for small and skinny products); a real model's cache state differs from a cycled probe's; "
              "small nodes (views, Adds, Gathers) are ranked within noise of each other, which bounds the "
              "per-node Spearman. AlexNet-LRN has been under-predicted in most runs: its strided "
              "7x7 first convolution over 3 channels and its numpy LRNs are the kernels furthest from the "
              "calibrated shapes. A tiny model whose weights fit in L2 (CNN-28's 0.8 MB classifier) runs its "
              "products from cache, faster than the cycled probes."]
    missed = [k for k, ok in s["targets_met"].items() if not ok]
    if missed:
        lines += ["", f"**Not met in this run: {', '.join(missed)}.**"]
    runs = results.get("history", [])
    if len(runs) > 1:
        lines += ["", "## Repeated runs of this command (newest last; the code at each run's commit)", "",
                  "| date | commit | MAPE | graph Spearman | per-node Spearman | load average at start | wall s |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['date']} | {r['commit']} | {r['graph_mape']:.1%} | {r['graph_spearman']:.3f} | "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r["node_spearman"].items())
                  + f" | {r['load_start']} | {r['wall_s']} |" for r in runs]
    lines += ["", "![predicted vs measured](cost_model.png)"]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join([*cm.SPECS, *EXPORTS]))
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--out", default="cost_model", help="output stem under bench/results")
    parser.add_argument("--no-recalibrate", dest="recalibrate", action="store_false",
                        help="calibrate once at the start instead of around each model")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    torch.set_num_threads(1)
    started, load_start, commit = time.perf_counter(), os.getloadavg(), git_commit()
    with threadpool_limits(1), tempfile.TemporaryDirectory() as cache:
        calibration = calibrate("x86-64")
        spec = calibration.spec
        print(f"calibrated: {calibration.environment['openblas_env']}; " + ", ".join(
            f"{k}={v}" for k, v in spec.model_dump().items() if k.endswith(("_us", "_gbs", "gflops", "_dim",
                                                                                "efficiency"))), flush=True)
        results = {"command": "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_cost_model.py"
                              + "".join(f" {a}" for a in (argv or sys.argv[1:])),
                   "environment": calibration.environment, "calibration": calibration.measured,
                   "removed_env": removed(), "commit": commit,
                   "spec": spec.model_dump(mode="json"), "recalibrate": args.recalibrate, "models": {}}
        batches = [int(b) for b in args.batches.split(",")]
        for name in models:
            graph, raw = bench(name, batches, spec, Path(cache), name in PER_NODE)
            specs = [spec]
            if args.recalibrate:
                # the machine is shared and its load drifts: each model is predicted with the
                # calibrations just before and just after its measurement (the next model's first)
                spec = calibrate("x86-64").spec
                specs.append(spec)
            results["models"][name] = entry_of(name, graph, raw, specs)
            results["models"][name]["spec_digest"] = "+".join(s.digest()[:8] for s in specs)
            results["models"][name]["spec"] = [{k: v for k, v in s.model_dump(mode="json").items()
                                                if k in ("peak_gflops", "call_overhead_us", "memory_bandwidth_gbs")}
                                               for s in specs]
    results["summary"] = summarise(results["models"])
    results["wall_s"] = time.perf_counter() - started
    results["load_average"] = {"start": [round(v, 2) for v in load_start],
                               "end": [round(v, 2) for v in os.getloadavg()]}
    RESULTS.mkdir(exist_ok=True)
    results["history"] = history(RESULTS / f"{args.out}.json", results)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    write_markdown(results, RESULTS / f"{args.out}.md")
    plot(results, RESULTS / f"{args.out}.png")
    print(json.dumps(results["summary"], indent=1))
    return results


if __name__ == "__main__":
    main()
