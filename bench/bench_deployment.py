"""One federation round on Flower's deployment engine (127.0.0.1, TLS + node authentication, three
enrolled SuperNodes) against the same round in Flower's simulation engine, side by side.

    .venv/bin/python bench/bench_deployment.py [--rounds 1] [--local-epochs 1]

Both runs use the demo federation (the sites' local epochs overridden, the same for both) and a
fresh home each. Deployment: set-up (homes, keys, certificates, enrollment) and start-up (SuperLink
healthy, SuperNodes online) are timed apart from the run itself (`flwr run` to completion).
Simulation: the whole `run_in_simulation` (Ray start-up included) and the run alone as the
ServerApp reports it. Results: bench/results/deployment.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def configs(root: Path, local_epochs: int) -> Path:
    (root / "sites").mkdir(parents=True)
    for site in (ROOT / "configs" / "sites").glob("*.yaml"):
        (root / "sites" / site.name).write_text(re.sub(r"local_epochs: \d+", f"local_epochs: {local_epochs}",
                                                       site.read_text()))
    fed = root / "federation.yaml"
    fed.write_text((ROOT / "configs" / "federation.yaml").read_text())
    return fed


def deployment(root: Path, fed: Path, rounds: int) -> dict:
    from cuvil_edge.cli.local_federation import APP_DIR, local_federation
    from cuvil_edge.coordinator.superlink import submit_run

    t0 = time.perf_counter()
    with local_federation(root, fed) as f:
        up = time.perf_counter() - t0
        t1 = time.perf_counter()
        submit_run(f.home, APP_DIR, fed, rounds)
        run = time.perf_counter() - t1
    [run_dir] = (f.home / "runs").iterdir()
    final = json.loads((run_dir / "metrics.json").read_text())["rounds"][-1]
    return {"setup_and_startup_s": round(up, 1), "run_s": round(run, 1), "final_accuracy": final["global_accuracy"]}


def simulation(root: Path, fed: Path, rounds: int) -> dict:
    from cuvil_edge.cli.local_federation import APP_DIR
    from cuvil_edge.coordinator.launcher import prepare_run, run_in_simulation

    spec = prepare_run(fed, root / "run", rounds, home=root / "home")
    t0 = time.perf_counter()
    metrics = run_in_simulation(spec, APP_DIR)
    return {"total_with_ray_s": round(time.perf_counter() - t0, 1),
            "final_accuracy": metrics["rounds"][-1]["global_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--local-epochs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dep = deployment(tmp / "dep", configs(tmp / "dep-configs", args.local_epochs), args.rounds)
        sim = simulation(tmp / "sim", configs(tmp / "sim-configs", args.local_epochs), args.rounds)
    result = {"python": platform.python_version(), "machine": platform.machine(), "rounds": args.rounds,
              "local_epochs": args.local_epochs, "sites": 3, "deployment": dep, "simulation": sim,
              "run_ratio_deployment_over_simulation": round(dep["run_s"] / sim["total_with_ray_s"], 2)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "deployment.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# A federation round: deployment engine vs simulation", "",
             f"3 sites, {args.rounds} round(s), {args.local_epochs} local epoch(s); `bench/bench_deployment.py`.", "",
             "| | time (s) |", "|---|---|",
             f"| deployment: set-up + start-up (homes, keys, certificates, enrollment, SuperLink, SuperNodes) | "
             f"{dep['setup_and_startup_s']} |",
             f"| deployment: the run (`flwr run` to completion) | {dep['run_s']} |",
             f"| simulation: the run, Ray start-up included | {sim['total_with_ray_s']} |",
             "", f"Run time ratio deployment / simulation: {result['run_ratio_deployment_over_simulation']}."]
    (RESULTS / "deployment.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
