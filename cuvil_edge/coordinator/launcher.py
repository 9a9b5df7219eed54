"""Start a federation run in Flower's simulation engine (Ray), one virtual node per site."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cuvil_edge.config import load_federation
from cuvil_edge.config.run_spec import ENV_VAR, RunSpec
from cuvil_edge.config.home import DEFAULT_HOME, keys_dir
from cuvil_edge.coordinator.checkpoints import resumed
from cuvil_edge.coordinator.keys import current_root, init_keys
from cuvil_edge.coordinator.report import STOPPED_CENTRAL_BUDGET
from cuvil_edge.errors import CuvilError

#: Flower settings for offline, quiet, reproducible runs (a caller's own values win).
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}


class RunFailedError(CuvilError):
    """The federation did not complete all its rounds."""


def prepare_run(federation_path: Path, run_dir: Path | None = None, rounds: int | None = None,
                home: Path | None = None, resume: bool = False) -> RunSpec:
    """Validate the configs, create the run directory, and write the run spec.

    Keys, version counters, checkpoints and every site's state (ledger included) live in ``home``
    (default ``.cuvil``) and persist across runs; keys are created there on first use only. With
    ``resume`` the run continues from the federation's newest checkpoint.

    Raises:
        ConfigError: the federation or a site file is invalid.
        KeyFileError: the home's keys are unusable.
    """
    federation_path = Path(federation_path).resolve()
    federation = load_federation(federation_path)
    federation.load_sites()
    if run_dir is None:
        run_dir = Path("runs") / f"{federation.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    home = (home or DEFAULT_HOME).resolve()
    keys = keys_dir(home)
    if (keys / "root.json").exists():
        current_root(keys)  # refuse a broken home now, not inside the simulation
        private, public = keys / "coordinator.key", keys / "root.json"
    else:
        private, public = init_keys(keys)
    spec = RunSpec(federation=str(federation_path), run_dir=str(run_dir), home=str(home),
                   coordinator_key=str(private), trust_root=str(public),
                   rounds=rounds or federation.rounds)
    if resume:  # continue from the newest checkpoint in the home: the rounds left, numbered on
        spec = resumed(spec)
    spec.save(run_dir / "run_spec.json")
    return spec


def run_in_simulation(spec: RunSpec, server_app, client_app) -> dict:
    """Run all rounds in Flower simulation and return the metrics written by the ServerApp.

    Raises:
        RunFailedError: fewer rounds were reported than requested, unless metrics.json
            says the run stopped early on the central ε budget (``stopped_early.reason``
            is :data:`~cuvil_edge.coordinator.report.STOPPED_CENTRAL_BUDGET`).
    """
    from flwr.simulation import run_simulation

    federation = load_federation(spec.federation)
    for key, value in FLOWER_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("FLWR_HOME", str(Path(spec.run_dir) / "flwr_home"))
    os.environ[ENV_VAR] = str(Path(spec.run_dir) / "run_spec.json")
    sim = federation.simulation
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=len(federation.sites),
                   backend_config={"client_resources": {"num_cpus": sim.client_cpus, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": sim.ray_cpus, "include_dashboard": False,
                                                 "log_to_driver": True}})
    metrics_path = Path(spec.run_dir) / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {"rounds": []}
    stopped = metrics.get("stopped_early") or {}
    if stopped.get("reason") == STOPPED_CENTRAL_BUDGET and 1 <= len(metrics["rounds"]) <= spec.rounds + 1:
        return metrics  # a clean stop: the next round would have exceeded central_dp.max_epsilon
    if len(metrics["rounds"]) != spec.rounds + 1:
        raise RunFailedError(f"the federation stopped after {max(0, len(metrics['rounds']) - 1)} of {spec.rounds} "
                             f"rounds; see the log above and {spec.run_dir}")
    return metrics
