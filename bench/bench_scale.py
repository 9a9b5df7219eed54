"""100 sites in Flower simulation on this machine: time per round, the coordinator's share, the
agents' time per site and peak memory (target <= 2 minutes per round).

    .venv/bin/python bench/bench_scale.py                       # 100 sites, 3 rounds -> bench/results/scale.{md,json}
    .venv/bin/python bench/bench_scale.py --sites 20 --no-write

Each site is a real site YAML with its own data file: 150 digits records resampled (with
replacement) from the demo's training split with Dirichlet(0.5) class proportions per site, so every
site has enough records for its batch; targets cycle through the four device specs. The federation
runs through `cuvil-edge demo` (Flower simulation, Ray, the real ServerApp and ClientApp) in a
subprocess; its metrics.json gives each round's wall time and the coordinator's
seconds issuing packages (signing and packing 100 of them per phase), and the agents report their
verify and build seconds. Training time is never sent (it would hint at a site's record count), so
the agents' training time is measured here, in this process, with the same ``train_round`` on the
same sites' data. Peak memory: the largest sum of resident memory over the run's processes (its
process tree), sampled every 0.5 s; shared pages count once per process, so it is an upper bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TARGETS = ("x86-64", "rpi4", "jetson-orin-nano", "ascend-310")
RECORDS = 150
TRAINING = {"local_epochs": 2, "batch_size": 30, "sample_rate": 0.2, "learning_rate": 0.15, "max_grad_norm": 1.0}


def write_federation(root: Path, sites: int, rounds: int) -> Path:
    from cuvil_edge.datasets import digits

    train_idx, _ = digits._train_test_indices(0.2)
    x, y = digits._load()
    x, y = x[train_idx], y[train_idx]
    rng = np.random.default_rng(0)
    (root / "sites").mkdir(parents=True)
    (root / "data").mkdir()
    for i in range(sites):
        weights = rng.dirichlet([0.5] * 10)[y]
        pick = rng.choice(len(y), size=RECORDS, replace=True, p=weights / weights.sum())
        np.savez(root / "data" / f"site-{i:03d}.npz", x=x[pick], y=y[pick])
        (root / "sites" / f"site-{i:03d}.yaml").write_text(yaml.safe_dump({
            "site": f"site-{i:03d}", "target": TARGETS[i % len(TARGETS)],
            "privacy": {"epsilon_budget": 8.0, "epsilon_per_round": 2.0, "eval_epsilon": 0.3},
            "training": TRAINING,
            "data": {"kind": "npz", "path": f"../data/site-{i:03d}.npz", "eval_fraction": 0.2,
                     "input_shape": [1, 8, 8], "num_classes": 10}}))
    federation = root / "federation.yaml"
    federation.write_text(yaml.safe_dump({
        "name": "scale", "rounds": rounds, "model": "builtin:digits-cnn",
        "sites": [f"sites/site-{i:03d}.yaml" for i in range(sites)],
        "simulation": {"client_cpus": 1, "ray_cpus": 2}, "round_timeout": 1800}))
    return federation


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and every process descended from it (Ray's raylet, workers ...)."""
    parent, rss = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            parent[int(pid)] = int(stat[stat.rindex(")") + 2:].split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss[int(pid)] = int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue  # the process ended meanwhile
    tree, frontier = {root}, [root]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier and p not in tree]
        tree.update(children)
        frontier = children
    return sum(rss.get(p, 0) for p in tree)


def run_federation(federation: Path, workdir: Path, rounds: int) -> tuple[dict, float, int, str]:
    env = dict(os.environ, FLWR_HOME=str(workdir / "flwr_home"), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    run_dir = workdir / "run"
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cuvil_edge", "demo", "--rounds", str(rounds), "--run-dir",
                             str(run_dir), "--home", str(workdir / "home"), "--federation", str(federation)],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"the federation failed ({proc.returncode}):\n{output[-4000:]}")
    return json.loads((run_dir / "metrics.json").read_text()), time.perf_counter() - started, peak[0], output


def agent_training_seconds(federation: Path, rounds: int) -> list[float]:
    """Per site: one round of ``train_round`` on its data, in this process (see the module doc)."""
    import torch

    from cuvil_edge.agent.training import train_round
    from cuvil_edge.config import load_federation
    from cuvil_edge.coordinator.model import load_federation_model
    from cuvil_edge.datasets.site_files import load_site_data
    from cuvil_edge.privacy import PrivacyLedger

    torch.set_num_threads(1)
    config = load_federation(federation)
    graph = load_federation_model(config.model, config.seed)
    seconds = []
    with tempfile.TemporaryDirectory() as tmp:
        for site in config.load_sites():
            train, _ = load_site_data(site.data, graph)
            ledger = PrivacyLedger(Path(tmp) / f"{site.site}.sqlite", site=site.site,
                                   epsilon_budget=site.privacy.epsilon_budget, delta=site.privacy.delta)
            t0 = time.perf_counter()
            train_round(graph, site, train, ledger, 1, 1, seed=0)
            seconds.append(time.perf_counter() - t0)
            ledger.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        federation = write_federation(workdir / "configs", args.sites, args.rounds)
        metrics, wall, peak, output = run_federation(federation, workdir, args.rounds)
        training = agent_training_seconds(federation, args.rounds)
    rounds = [r for r in metrics["rounds"] if r["round"] > 0]
    per_round = []
    for r in rounds:
        sites = r["sites"].values()
        coordinator = r.get("coordinator", {})
        per_round.append({
            "round": r["round"], "seconds": r["seconds"], "accuracy": r["global_accuracy"],
            "coordinator_seconds": round(sum(coordinator.values()), 3), "coordinator": coordinator,
            "ok": sum(s.get("status") == "ok" for s in sites),
            "verify_ms_median": 1000 * statistics.median(s.get("train-verify-seconds", float("nan")) for s in sites),
            "build_ms_median": 1000 * statistics.median(s.get("train-build-seconds", float("nan")) for s in sites)})
    result = {"sites": args.sites, "rounds": args.rounds, "records_per_site": RECORDS, "training": TRAINING,
              "wall_seconds": round(wall, 1), "peak_rss_bytes": peak, "per_round": per_round,
              "agent_train_seconds": {"median": statistics.median(training), "max": max(training),
                                      "sum": sum(training)},
              "machine": f"{platform.platform()}, {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                               time.gmtime())}
    lines = [f"# {args.sites} sites in Flower simulation ({args.rounds} rounds)", "",
             f"Command: `.venv/bin/python bench/bench_scale.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`  ",
             f"Machine: {result['machine']}; {result['date']}. Target: <= 120 s per round.", "",
             f"Each site: {RECORDS} resampled digits records (non-IID), DP-SGD {TRAINING}; the demo's CNN; "
             "targets cycle x86-64 / rpi4 / jetson-orin-nano / ascend-310.", "",
             "| round | wall s | coordinator s (packages: train + eval) | sites ok | verify ms (median) | "
             "build ms (median) | global accuracy |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {p['round']} | {p['seconds']:.1f} | {p['coordinator_seconds']:.2f} | {p['ok']}/{args.sites} | "
              f"{p['verify_ms_median']:.1f} | {p['build_ms_median']:.1f} | {p['accuracy']:.3f} |" for p in per_round]
    t = result["agent_train_seconds"]
    lines += ["", f"Agent training per site (one round of train_round in one process, measured here): median "
              f"{t['median']:.2f} s, max {t['max']:.2f} s, {t['sum']:.0f} s for all {args.sites} sites.",
              f"Whole run (Ray start, round 0 evaluation, {args.rounds} rounds, shutdown): {wall:.0f} s; peak resident "
              f"memory of the run's processes: {peak / 2**30:.2f} GiB."]
    print("\n".join(lines))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "scale.md").write_text("\n".join(lines) + "\n")
        (RESULTS / "scale.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
