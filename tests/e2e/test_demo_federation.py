"""End to end: the shipped demo federation in Flower simulation, fewer rounds.

Runs `python -m cuvil_edge demo` in a subprocess (Ray starts and stops with it),
with its own FLWR_HOME, and checks what a user would look at.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuvil_edge.config import load_site
from cuvil_edge.coordinator.checkpoints import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def run_demo(tmp_path: Path, rounds: int, federation: Path) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "run"
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr_home"), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    proc = subprocess.run(
        [sys.executable, "-m", "cuvil_edge", "demo", "--rounds", str(rounds), "--run-dir", str(run_dir),
         "--federation", str(federation)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )
    return proc, run_dir


def shipped_federation() -> str:
    """The shipped federation file's text, for a variant of it, on one Ray worker instead of two:
    the sites then train one after the other, and torch and opacus are imported once, not in both
    workers (the variants check what a run computes; the shipped demo keeps its two workers)."""
    text = (ROOT / "configs" / "federation.yaml").read_text()
    assert "  ray_cpus: 2\n" in text
    return text.replace("  ray_cpus: 2\n", "  ray_cpus: 1\n")


DEMO_STRATEGY = "name: fedavgm                 # fedavg | fedprox | fedadam | fedyogi | fedavgm\n  server_momentum: 0.5"


def strategy_federation(tmp_path: Path, strategy: str) -> Path:
    """A copy of the demo federation (one Ray worker) with ``strategy`` in place of FedAvgM: its
    folder, whose ``sites`` folder holds copies of the shipped site files."""
    configs = tmp_path / "configs"
    (configs / "sites").mkdir(parents=True)
    text = shipped_federation()
    assert DEMO_STRATEGY in text
    (configs / "federation.yaml").write_text(text.replace(DEMO_STRATEGY, strategy, 1))
    for site in (ROOT / "configs" / "sites").glob("*.yaml"):
        (configs / "sites" / site.name).write_text(site.read_text())
    return configs


def central_dp_federation(tmp_path: Path, max_epsilon: float | None = None) -> tuple[Path, str]:
    """A copy of the demo federation with central DP on and local DP-SGD off, under FedAvg (central
    DP's accountant covers FedAvg's noised mean only): (its file, its text)."""
    federation = strategy_federation(tmp_path, "name: fedavg") / "federation.yaml"
    text = federation.read_text().replace("local_dp: true", "local_dp: false")
    text = text.replace("  enabled: false", "  enabled: true")
    if max_epsilon is not None:
        text = text.replace("  # max_epsilon: 10.0", f"  max_epsilon: {max_epsilon}")
        assert f"  max_epsilon: {max_epsilon}" in text
    federation.write_text(text)
    return federation, text


def test_demo_federation_learns_accounts_privacy_and_resumes(tmp_path):
    """Two rounds of the shipped demo, then `--resume` to three: the resumed run starts from round 2's
    weights (same global accuracy before it trains) and the demo's FedAvgM momentum, numbers its
    round 3, and keeps the home's keys and counters."""
    shipped = ROOT / "configs" / "federation.yaml"
    proc, run_dir = run_demo(tmp_path, 2, shipped)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    rounds = metrics["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[-1]["global_accuracy"] > rounds[0]["global_accuracy"] + 0.2
    for site, stats in rounds[-1]["sites"].items():
        assert stats["status"] == "ok", (site, stats)
        assert 0 < stats["eps-spent"] <= 8.0
        assert stats["eps-spent"] + stats["eps-remaining"] == pytest.approx(8.0)
        assert stats["package-bytes"] > 0
    spent = [r["sites"]["hospital-a"]["eps-spent"] for r in rounds[1:]]
    assert spent[1] > spent[0]  # every round spends
    assert (run_dir / "metrics.png").stat().st_size > 1000
    assert "global test accuracy" in proc.stdout
    home = tmp_path / ".cuvil"  # the default home, in the working directory
    pruned = list((home / "agents").glob("*/build-cache/*/module.py"))
    assert len({p.parts[-4] for p in pruned}) == 3  # every site built locally
    for entry in rounds[1:]:  # the sites' noisy counts, pooled: never outside [0, 1]
        fed = entry.get("federated_accuracy")
        if fed is None:  # ε 0.05 per release: the noisy totals can sum to <= 0 (a few % of rounds); no estimate then
            assert sum(stats["eval-noisy-total"] for stats in entry["sites"].values()) <= 0, entry
        else:
            assert 0.0 <= fed["low"] <= fed["accuracy"] <= fed["high"] <= 1.0 and fed["sites"] == 3
        for stats in entry["sites"].values():  # NaN: the noisy total came out <= 0, so no local estimate
            assert stats["eval-accuracy"] != stats["eval-accuracy"] or 0.0 <= stats["eval-accuracy"] <= 1.0
            assert set(stats) >= {"eval-noisy-correct", "eval-noisy-total"} and "train-train-seconds" not in stats
    assert "pooled accuracy" in proc.stdout and str(home) in proc.stdout.replace("\n", "")
    # the site's ledger is the one in the home: `privacy status` reads what the run spent
    status = subprocess.run([sys.executable, "-m", "cuvil_edge", "privacy", "status", "--site",
                             str(ROOT / "configs" / "sites" / "hospital-a.yaml")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert f"ε spent {rounds[-1]['sites']['hospital-a']['eps-spent']:.4f}" in status.stdout, status.stdout

    saved = latest_checkpoint(home, "digits-demo")
    assert saved.round == 2 and {k.split("/")[:2] == ["FedAvgM", "momentum"] for k in saved.optimiser} == {True}
    assert {k.split("/", 2)[2] for k in saved.optimiser} == set(saved.weights)
    root = (home / "keys" / "root.json").read_bytes()
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr_home"), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    again = subprocess.run([sys.executable, "-m", "cuvil_edge", "demo", "--rounds", "3", "--resume", "--run-dir",
                            str(tmp_path / "run2"), "--federation", str(shipped)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed = json.loads((tmp_path / "run2" / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in resumed] == [2, 3]
    assert resumed[0]["global_accuracy"] == rounds[-1]["global_accuracy"]  # the same weights
    assert all(s["status"] == "ok" for s in resumed[1]["sites"].values())  # packages still accepted
    assert (home / "keys" / "root.json").read_bytes() == root


def test_central_dp_stops_at_its_cap_and_a_resumed_run_counts_epsilon_from_where_it_stopped(tmp_path):
    """Flower's client-side fixed clipping + RDP accountant, local DP-SGD off (nm = 1, 3 of 3 sites,
    δ 1e-5: ε 4.73 after one release, 7.08 after two; notes/flower-1.42.md section 4).

    1. max_epsilon 6 admits one release but not two: 3 requested rounds, 1 run, a clean stop.
    2. Attack: resume under the same cap. Were the accountant restarted from zero, round 2 would be
       released (a real ε of 7.08 > 6) and reported as 4.73; the checkpoint carries the releases,
       so the resumed run refuses round 2.
    3. Without the cap, round 2 goes on and ε counts on from the first run's release."""
    federation, text = central_dp_federation(tmp_path, max_epsilon=6.0)
    proc, run_dir = run_demo(tmp_path, 3, federation)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [r["round"] for r in metrics["rounds"]] == [0, 1]
    assert metrics["rounds"][1]["central_dp"]["epsilon"] == pytest.approx(4.73, abs=0.01)
    assert metrics["rounds"][1]["central_dp"]["released"]
    assert metrics["stopped_early"]["reason"] == "stopped early: central ε budget"
    assert metrics["stopped_early"]["completed_rounds"] == 1
    assert (run_dir / "metrics.png").stat().st_size > 1000
    assert "stopped early: central ε budget" in proc.stdout and "central DP (site-level" in proc.stdout

    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr_home"), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    again = subprocess.run([sys.executable, "-m", "cuvil_edge", "demo", "--rounds", "3", "--resume", "--run-dir",
                            str(tmp_path / "run2"), "--federation", str(federation)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed = json.loads((tmp_path / "run2" / "metrics.json").read_text())
    assert [r["round"] for r in resumed["rounds"]] == [1]  # round 2 was never released
    assert resumed["stopped_early"]["completed_rounds"] == 1

    uncapped = text.replace("  max_epsilon: 6.0", "  # max_epsilon: 10.0")
    assert uncapped != text
    federation.write_text(uncapped)
    again = subprocess.run([sys.executable, "-m", "cuvil_edge", "demo", "--rounds", "2", "--resume", "--run-dir",
                            str(tmp_path / "run3"), "--federation", str(federation)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rounds = json.loads((tmp_path / "run3" / "metrics.json").read_text())["rounds"]
    assert rounds[-1]["round"] == 2 and rounds[-1]["central_dp"]["epsilon"] == pytest.approx(7.08, abs=0.01)
    assert rounds[-1]["central_dp"]["released"]
    for site, stats in rounds[-1]["sites"].items():
        assert stats["status"] == "ok", (site, stats)
        assert stats["train-num-examples"] == 1  # equal weights, as the accountant requires
        assert stats["train-eps-round"] == float("inf")  # local DP-SGD off: no record-level guarantee
        assert stats["eps-spent"] == pytest.approx(0.1)  # only the two evaluation releases (0.05 each) spend


def assert_each_site_paid_its_plan(configs: Path, sites: dict) -> None:
    """Every site that trained spent no more ε in the round than its site file plans."""
    for site, stats in sites.items():
        planned = load_site(configs / "sites" / f"{site}.yaml").privacy.epsilon_per_round
        assert stats["train-eps-round"] <= planned + 1e-6, site


# Each variant is one simulation run (about half a minute of both cores), so a run checks two things
# that do not interfere: what a strategy from the YAML does, and what a site's file makes it do.
def test_fedprox_from_the_yaml_learns_and_a_site_out_of_budget_drops_out_while_the_run_goes_on(tmp_path):
    """FedProx (each site adds the proximal term under DP-SGD) around the per-site packages: two
    rounds of all three sites learn, and every site pays only its DP-SGD plan (the proximal term is
    free). fleet-c's budget is enough for two rounds of training, not three (ε 1.87 after one round
    with its evaluation, 2.50 after two): round 3 leaves it out of the average, says so, and the
    others go on."""
    configs = strategy_federation(tmp_path, "name: fedprox\n  proximal_mu: 0.05")
    fleet = configs / "sites" / "fleet-c.yaml"
    assert "epsilon_budget: 8.0" in fleet.read_text()
    fleet.write_text(fleet.read_text().replace("epsilon_budget: 8.0", "epsilon_budget: 2.7"))
    proc, run_dir = run_demo(tmp_path, 3, configs / "federation.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for entry in rounds[1:3]:
        assert all(stats["status"] == "ok" for stats in entry["sites"].values()), entry["sites"]
        assert entry["dropped_out"] == []
        assert_each_site_paid_its_plan(configs, entry["sites"])
    accuracy = [r["global_accuracy"] for r in rounds]
    assert accuracy[2] > accuracy[0] + 0.2, accuracy
    last = rounds[3]["sites"]
    assert last["fleet-c"]["status"] == "budget exhausted"
    assert last["fleet-c"]["eps-spent"] <= 2.7
    assert last["hospital-a"]["status"] == last["factory-b"]["status"] == "ok"
    assert rounds[3]["dropped_out"] == ["fleet-c"]
    assert last["fleet-c"]["train-num-examples"] == 0  # its reply carried no update
    assert "fleet-c: privacy budget exhausted; left out of this round's average" in proc.stdout
    assert accuracy[3] > accuracy[0], accuracy


def test_fedadam_from_the_yaml_learns_with_sites_planned_at_fp16_and_int8(tmp_path):
    """FedAdam (server state across rounds) around the per-site packages, with download limits that
    put factory-b at fp16 and fleet-c at int8 (calibrated on public digits the coordinator holds):
    every site trains the package it was sent, pays only its DP-SGD plan, and the model learns."""
    import numpy as np

    from cuvil_edge.coordinator.model import load_federation_model
    from cuvil_edge.coordinator.plan import precision_variants
    from cuvil_edge.datasets import digits
    from cuvil_edge.ir_serialize import encode_payload

    configs = strategy_federation(tmp_path, "name: fedadam\n  eta: 0.05")
    graph = load_federation_model("builtin:digits-cnn", 0)
    samples = digits.global_test().x[:96]
    np.savez(configs / "calibration.npz", samples)
    sizes = {p: len(encode_payload(g)) for p, g in
             precision_variants(graph, [{graph.inputs[0].name: samples[:32]}]).items()}
    between = {"factory-b": (sizes["fp16"] + sizes["fp32"]) / 2, "fleet-c": (sizes["int8"] + sizes["fp16"]) / 2}
    federation = configs / "federation.yaml"
    federation.write_text(federation.read_text() + "quantization:\n  calibration: calibration.npz\n")
    for site, limit in between.items():
        path = configs / "sites" / f"{site}.yaml"
        path.write_text(path.read_text() + f"limits:\n  download_mb: {limit / 2**20}\n")
    proc, run_dir = run_demo(tmp_path, 3, federation)  # FedAdam at eta 0.05 with two narrowed sites: slower
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    last = rounds[-1]["sites"]
    assert {s: last[s]["precision"] for s in last} == {"hospital-a": "fp32", "factory-b": "fp16", "fleet-c": "int8"}
    assert all(stats["status"] == "ok" for stats in last.values()), last
    assert last["fleet-c"]["package-bytes"] < last["factory-b"]["package-bytes"] < last["hospital-a"]["package-bytes"]
    accuracy = [r["global_accuracy"] for r in rounds]
    assert accuracy[3] > accuracy[0] + 0.2, accuracy
    assert_each_site_paid_its_plan(configs, last)
