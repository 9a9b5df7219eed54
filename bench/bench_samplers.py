"""Benchmark the exact samplers and the grid release: 100,000 values, OS CSPRNG.

Times (median of REPEATS) the discrete Laplace and discrete Gaussian samplers
alone and the full grid mechanism (round to 2^-k, widen the sensitivity, add
exact noise, scale back) for 100,000 float values, without the ledger (whose
cost is one SQLite transaction per release, independent of the size).
Target: under 1 s per 100,000 released values. Writes
bench/results/samplers.json.

    .venv/bin/python bench/bench_samplers.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from cuvil_edge.privacy import samplers
from cuvil_edge.privacy.release import apply_plan, gaussian_sigma_for, plan_gaussian, plan_laplace

N = 100_000
REPEATS = 5


def _median_s(fn) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> dict:
    values = np.random.default_rng(0).uniform(-1, 1, N)
    lap = plan_laplace(2.0, 1.2, N)  # L1 sensitivity 2, eps 1.2
    gau = plan_gaussian(1.0, gaussian_sigma_for(1.0, 1e-5, 1.0), N)
    results = {
        "n_values": N,
        "repeats": REPEATS,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "rng": "secrets.SystemRandom (os.urandom)",
        "laplace_plan": {"k": lap.k, "scale_grid_units": float(lap.scale)},
        "gaussian_plan": {"k": gau.k, "sigma_grid_units": float(gau.sigma2) ** 0.5},
        "discrete_laplace_sampler_s": _median_s(lambda: samplers.discrete_laplace(lap.scale, N)),
        "discrete_gaussian_sampler_s": _median_s(lambda: samplers.discrete_gaussian(gau.sigma2, N)),
        "release_laplace_s": _median_s(lambda: apply_plan(lap, values)),
        "release_gaussian_s": _median_s(lambda: apply_plan(gau, values)),
    }
    results["target_s"] = 1.0
    results["meets_target"] = max(results["release_laplace_s"], results["release_gaussian_s"]) < 1.0
    return results


if __name__ == "__main__":
    out = main()
    path = Path(__file__).parent / "results" / "samplers.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
