"""Benchmark the agent's inference path: verify, build, run; and the build cache.

Two parts, written to bench/results/agent_path.{json,md}:

* **Per target, the digits CNN through real packages**: package verification, a cold build vs a
  cache hit, and the compiled module's run time against the reference interpreter.
* **Build cost, ResNet-50 and the digits CNN, target x86-64** (ONNX -> ``load_model`` ->
  ``passes.optimize``; the package is a stand-in holding the graph and its payload digest):

  - *cold, fresh process*: a new Python process (only cuvil_edge imported, as an agent) builds into
    an empty cache folder, so every per-process memo is cold; the time of the ``build()`` call;
  - *cold, in process*: builds into empty cache folders in this process (the first one with the
    memos as this process left them, later ones with the kernel specialisations remembered);
  - *hit, fresh process*: a new process builds a key that is on disk (reads module.py, meta.json,
    module.code);
  - *hit, same process*: the same package again in this process;
  - *new-weights hit*: each time a new package with other float weights (same structure), in
    this process.

  Medians (and min/max) over the samples; the fresh-process figures come from separate processes.

Run (the machine's OPENBLAS_* variables slow numpy's BLAS; the build does not care, the run times do)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_agent_path.py

``--worker ONNX CACHE`` is the fresh-process half (used by the benchmark itself). The results name
the commit and any uncommitted changes under cuvil_edge/; ``--commit C`` names the commit when the
script runs from a clean export of it (``git archive C``), where there is no git to ask.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cuvil_edge.device_targets import build, list_targets
from cuvil_edge.frontend import load_model
from cuvil_edge.ir.infer import with_initializers
from cuvil_edge.passes import optimize

REPEATS = 7  # in-process samples
FRESH = 5  # fresh-process samples
BATCH = 256
TARGET = "x86-64"
RESULTS = Path(__file__).resolve().parent / "results"


class _Package:
    """What build() needs: the graph and a payload digest."""

    def __init__(self, graph, digest: str) -> None:
        self.graph, self.payload_digest = graph, digest


def best_of(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def summary(samples: list[float]) -> dict:
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
            "n": len(samples), "samples_s": samples}


def worker(onnx_path: str, cache: str) -> None:
    """One build in this (fresh) process; prints {"build_s", "cache_hit"}."""
    data = Path(onnx_path).read_bytes()
    graph, _ = optimize(load_model(data))
    package = _Package(graph, hashlib.sha256(data).hexdigest())
    start = time.perf_counter()
    model = build(package, TARGET, cache_dir=cache)
    seconds = time.perf_counter() - start
    heavy = [m for m in ("torch", "onnx", "onnxruntime") if m in sys.modules]
    print(json.dumps({"build_s": seconds, "cache_hit": model.cache_hit, "heavy_modules": heavy}))


def fresh_build(onnx_path: Path, cache: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", str(onnx_path), str(cache)], check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_cost(name: str, data: bytes, work: Path) -> dict:
    """The five build-cost figures for one model (see the module docstring)."""
    onnx_path = work / f"{name}.onnx"
    onnx_path.write_bytes(data)
    graph, _ = optimize(load_model(data))
    package = _Package(graph, hashlib.sha256(data).hexdigest())
    cold_fresh, hit_fresh = [], []
    for i in range(FRESH):
        cache = work / f"{name}-fresh-{i}"
        cold = fresh_build(onnx_path, cache)
        hit = fresh_build(onnx_path, cache)
        if cold["cache_hit"] or not hit["cache_hit"]:
            raise RuntimeError(f"{name}: expected a miss then a hit, got {cold}, {hit}")
        cold_fresh.append(cold["build_s"])
        hit_fresh.append(hit["build_s"])
    cold_in = []
    for i in range(REPEATS):
        start = time.perf_counter()
        model = build(package, TARGET, cache_dir=work / f"{name}-in-{i}")
        cold_in.append(time.perf_counter() - start)
        assert not model.cache_hit
    cache = work / f"{name}-in-0"
    hit_same, hit_weights = [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        assert build(package, TARGET, cache_dir=cache).cache_hit
        hit_same.append(time.perf_counter() - start)
    rng = np.random.default_rng(0)
    floats = [k for k, v in graph.initializers.items() if v.dtype.kind == "f"]
    for i in range(REPEATS):
        scale = {k: (graph.initializers[k] * rng.uniform(0.5, 1.5)).astype(graph.initializers[k].dtype) for k in floats}
        newer = _Package(with_initializers(graph, scale), f"{i + 1:064x}")
        start = time.perf_counter()
        assert build(newer, TARGET, cache_dir=cache).cache_hit
        hit_weights.append(time.perf_counter() - start)
    return {
        "nodes": len(graph.nodes), "source_chars": len(model.source),
        "cold_fresh_process": summary(cold_fresh), "cold_in_process": summary(cold_in),
        "cold_in_process_first_s": cold_in[0],
        "hit_fresh_process": summary(hit_fresh), "hit_same_process": summary(hit_same),
        "hit_new_weights": summary(hit_weights),
    }


def per_target() -> dict:
    """The digits CNN through real packages, per target (verify, cold build, hit, run)."""
    from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx
    from cuvil_edge.ir import interpreter
    from cuvil_edge.ir_serialize import AntiRollbackState, verify_and_accept, write_package

    graph, _ = optimize(load_model(digits_cnn_onnx(0)))  # what a coordinator packages: the optimised graph
    keys_dir = Path(tempfile.mkdtemp())
    private_path, _ = init_keys(keys_dir)
    keys, root_json = load_signing_keys(private_path), (keys_dir / "root.json").read_bytes()
    now = int(time.time())
    x = np.random.default_rng(0).random((BATCH, 1, 8, 8), dtype=np.float32)
    interp = best_of(lambda: interpreter.run(graph, {"image": x}))
    results: dict = {"interpreter_s": interp}
    for target in list_targets():
        data = write_package(graph, site="bench", target=target, version=1, signing_key=keys.coordinator,
                             release_key=keys.release, issued_at=now, expires=now + 600)
        state = AntiRollbackState(Path(tempfile.mkdtemp()))
        state.initialise(root_json)
        verify = lambda: verify_and_accept(data, state, site="bench", target=target, now=now,  # noqa: E731
                                           max_package_bytes=1 << 30)  # re-delivery: verify + idempotent record
        package = verify()
        with tempfile.TemporaryDirectory() as cache:
            cold = time.perf_counter()
            model = build(package, target, cache_dir=Path(cache))
            cold = time.perf_counter() - cold
            warm = best_of(lambda: build(package, target, cache_dir=Path(cache)))
        run = best_of(lambda: model.run({"image": x}))
        results[target] = {
            "package_bytes": len(data), "verify_s": best_of(verify), "build_cold_s": cold,
            "build_cache_hit_s": warm, "run_s": run, "speedup_vs_interpreter": interp / run,
            "pruned_source_lines": model.source.count("\n"),
        }
    return results


def models() -> dict[str, bytes]:
    """ONNX of the digits CNN and of ResNet-50 (exported with torch, as bench_compiled does)."""
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_compiled
    import compiled_models

    resnet50, _ = bench_compiled.export("resnet50", compiled_models.make("resnet50"))
    return {"digits_cnn": digits_cnn_onnx(0), "resnet50": resnet50}


def machine(commit_given: str | None = None) -> dict:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent,
                                  timeout=30).stdout
        except OSError:
            return None

    commit = commit_given or (git("rev-parse", "--short", "HEAD") or "").strip() or None
    changed = [] if commit_given else (git("status", "--porcelain", "--", "../cuvil_edge") or "").splitlines()
    return {"python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(), "commit": commit,
            "uncommitted_package_files": [line[3:] for line in changed], "clean_export": bool(commit_given),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
            "openblas_l2_size": os.environ.get("OPENBLAS_L2_SIZE")}


def markdown(out: dict) -> str:
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    lines = [
        "# Agent path: build cost and per-target run",
        "",
        "    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_agent_path.py",
        "",
        f"Machine: {out['machine']['platform']}, {out['machine']['cpus']} CPUs (shared; load average at start "
        f"{', '.join(f'{v:.2f}' for v in out['machine']['load_average_at_start'])}), Python "
        f"{out['machine']['python']}, numpy {out['machine']['numpy']}, cuvil_edge at {out['machine']['commit']}"
        + (f" with uncommitted changes to {', '.join(out['machine']['uncommitted_package_files'])}"
           if out["machine"]["uncommitted_package_files"] else "")
        + (" (run from a clean export of it, with --commit)" if out["machine"]["clean_export"] else "") + ".",
        "",
        f"Build cost, target {TARGET}, ms: median (min-max) of {FRESH} fresh processes or {REPEATS} in-process "
        "builds. Targets: cold ResNet-50 <= 500 ms, cached <= 10 ms.",
        "",
        "| model | nodes | cold, fresh process | cold, in process (first) | hit, fresh process "
        "| hit, same process | new-weights hit |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in out["build_cost"].items():
        cell = lambda key: f"{ms(r[key]['median_s'])} ({ms(r[key]['min_s'])}-{ms(r[key]['max_s'])})"  # noqa: E731
        lines.append(f"| {name} | {r['nodes']} | {cell('cold_fresh_process')} | {cell('cold_in_process')} "
                     f"({ms(r['cold_in_process_first_s'])}) | {cell('hit_fresh_process')} "
                     f"| {cell('hit_same_process')} | {cell('hit_new_weights')} |")
    lines += ["", "Cold in process: the first build of the process in parentheses; the later ones find the "
              "kernel specialisations already made. A hit reads and checks module.py against meta.json; "
              "a fresh process then loads module.code (marshal), the same process reuses its code object.",
              "", f"Digits CNN per target (real packages, batch {BATCH}), ms:", "",
              "| target | verify | cold build | cache hit | run | vs interpreter |", "|---|---|---|---|---|---|"]
    for target, r in out["targets"].items():
        if isinstance(r, dict):
            lines.append(f"| {target} | {ms(r['verify_s'])} | {ms(r['build_cold_s'])} | {ms(r['build_cache_hit_s'])} "
                         f"| {ms(r['run_s'])} | {r['speedup_vs_interpreter']:.1f}x |")
    return "\n".join(lines) + "\n"


def main(commit: str | None = None) -> dict:
    out: dict = {"machine": machine(commit), "target": TARGET, "repeats": REPEATS, "fresh_processes": FRESH,
                 "batch": BATCH, "build_cost": {}}
    data = models()
    with tempfile.TemporaryDirectory() as work:
        for name in ("digits_cnn", "resnet50"):
            out["build_cost"][name] = build_cost(name, data[name], Path(work))
    out["targets"] = per_target()
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("ONNX", "CACHE"))
    parser.add_argument("--commit", help="the commit measured, when running from a clean export (no .git)")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        sys.exit(0)
    result = main(args.commit)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "agent_path.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "agent_path.md").write_text(markdown(result))
    print(markdown(result))
