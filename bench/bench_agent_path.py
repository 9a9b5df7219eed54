"""Benchmark the agent's inference path on the demo model: verify, build, run.

Measures side by side in one process (ratios, not absolute targets, since the
machines are shared): package verification, a cold build vs a cache hit, and
the compiled module's throughput against the reference interpreter, for each
target spec.  Writes bench/results/agent_path.json.

    .venv/bin/python bench/bench_agent_path.py          # OPENBLAS_* left as the machine sets them
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from cuvil_edge.device_targets import build, list_targets
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir import interpreter
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.ir_serialize import AntiRollbackState, verify_and_accept, write_package

REPEATS = 7
BATCH = 256


def best_of(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> dict:
    graph = load_model(digits_cnn_onnx(0))
    keys_dir = Path(tempfile.mkdtemp())
    private_path, _ = init_keys(keys_dir)
    keys, root_json = load_signing_keys(private_path), (keys_dir / "root.json").read_bytes()
    now = int(time.time())
    x = np.random.default_rng(0).random((BATCH, 1, 8, 8), dtype=np.float32)
    results: dict = {"batch": BATCH, "repeats": REPEATS, "python": platform.python_version(),
                     "numpy": np.__version__, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
                     "targets": {}}
    interp = best_of(lambda: interpreter.run(graph, {"image": x}))
    results["interpreter_s"] = interp
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
        results["targets"][target] = {
            "package_bytes": len(data), "verify_s": best_of(verify), "build_cold_s": cold,
            "build_cache_hit_s": warm, "run_s": run, "speedup_vs_interpreter": interp / run,
            "pruned_source_lines": model.source.count("\n"),
        }
    return results


if __name__ == "__main__":
    out = main()
    path = Path(__file__).parent / "results" / "agent_path.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
