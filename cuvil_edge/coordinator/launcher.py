"""Start a federation run in Flower's simulation engine (Ray), one virtual node per site.

The non-deprecated way of Flower 1.42: a SuperLink in simulation mode on 127.0.0.1 (started here,
stopped here by process group) and ``flwr run`` of the cuvil-edge Flower App against it, the run
spec named in the run config. Flower's own state and CLI configuration live in the run directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cuvil_edge.config import load_federation
from cuvil_edge.config.flower_env import flower_tool, flwr_env
from cuvil_edge.config.home import DEFAULT_HOME, keys_dir
from cuvil_edge.config.run_spec import RUN_CONFIG_KEY, RunSpec
from cuvil_edge.coordinator.checkpoints import resumed
from cuvil_edge.coordinator.keys import current_root, init_keys
from cuvil_edge.coordinator.report import STOPPED_CENTRAL_BUDGET
from cuvil_edge.coordinator.superlink import flwr_run, free_port, wait_healthy
from cuvil_edge.errors import CuvilError

#: Ray settings for quiet runs without accelerators (a caller's own values win).
RAY_ENV = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "RAY_DEDUP_LOGS": "0"}
#: The connection name of the simulation SuperLink in the run directory's Flower configuration.
SIMULATION_CONNECTION = "simulation"


class RunFailedError(CuvilError):
    """The federation did not complete all its rounds."""


def prepare_run(
    federation_path: Path,
    run_dir: Path | None = None,
    rounds: int | None = None,
    home: Path | None = None,
    resume: bool = False,
) -> RunSpec:
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
    spec = RunSpec(
        federation=str(federation_path),
        run_dir=str(run_dir),
        home=str(home),
        coordinator_key=str(private),
        trust_root=str(public),
        rounds=rounds or federation.rounds,
    )
    if resume:  # continue from the newest checkpoint in the home: the rounds left of its plan, numbered on
        spec = resumed(spec, rounds)
    spec.save(run_dir / "run_spec.json")
    return spec


@contextmanager
def simulation_superlink(run_dir: Path) -> Iterator[str]:
    """A SuperLink in simulation mode on 127.0.0.1 for one run; yields the CLI connection name.

    It runs in its own process group (it starts the ServerApp process, which starts Ray), and the
    whole group is stopped on exit, so nothing outlives the run.

    Raises:
        DeploymentError: it did not become healthy.
    """
    run_dir = Path(run_dir)
    port = free_port()
    env = flwr_env(run_dir)
    for key, value in RAY_ENV.items():
        env.setdefault(key, value)
    config = Path(env["FLWR_HOME"]) / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[superlink]\ndefault = "{SIMULATION_CONNECTION}"\n\n[superlink.{SIMULATION_CONNECTION}]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n',
        encoding="utf-8",
    )
    command = [
        flower_tool("flower-superlink"),
        "--insecure",
        "--simulation",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--database",
        str(Path(env["FLWR_HOME"]) / "superlink.db"),
        "--disable-runtime-dependency-installation",
    ]
    with open(run_dir / "superlink.log", "ab") as log_file:
        proc = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        yield SIMULATION_CONNECTION
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group led by ``proc``; after 30 s (or once the leader is gone) SIGKILL
    whatever of the group is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_in_simulation(spec: RunSpec, app_dir: Path, verbose: bool = False) -> dict:
    """Run all rounds in Flower simulation and return the metrics written by the ServerApp.

    ``app_dir`` is the Flower App naming the ServerApp and ClientApp (`cli/flwr_app`); ``verbose``
    keeps all of Flower's output.

    Raises:
        RunFailedError: the run did not complete (see :func:`completed_metrics`).
        DeploymentError: the simulation SuperLink did not start.
    """
    federation = load_federation(spec.federation)
    sim = federation.simulation
    run_dir = Path(spec.run_dir)
    failure = None
    with simulation_superlink(run_dir) as connection:
        try:
            flwr_run(
                run_dir,
                app_dir,
                connection,
                f"{RUN_CONFIG_KEY}='{run_dir / 'run_spec.json'}'",
                federation_config=f"num-supernodes={len(federation.sites)} "
                f"client-resources-num-cpus={sim.client_cpus} init-args-num-cpus={sim.ray_cpus}",
                verbose=verbose,
            )
        except CuvilError as e:
            failure = e  # metrics.json says how far it got
    return completed_metrics(run_dir, spec.rounds, failure)


def completed_metrics(run_dir: Path, rounds: int, failure: Exception | None = None) -> dict:
    """The run's metrics.json if the run completed its ``rounds`` or stopped cleanly on the central ε
    budget (``stopped_early.reason`` is :data:`~cuvil_edge.coordinator.report.STOPPED_CENTRAL_BUDGET`).

    Raises:
        RunFailedError: anything else, ``failure`` (the engine's own complaint) included.
    """
    metrics_path = Path(run_dir) / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {"rounds": []}
    stopped = metrics.get("stopped_early") or {}
    if stopped.get("reason") == STOPPED_CENTRAL_BUDGET and 1 <= len(metrics["rounds"]) <= rounds + 1:
        return metrics  # a clean stop: the next round would have exceeded central_dp.max_epsilon
    if failure is not None and len(metrics["rounds"]) == rounds + 1:  # every round ran, then the app failed
        raise RunFailedError(
            f"{getattr(failure, 'reason', None) or failure}; see the log above and {Path(run_dir) / 'superlink.log'}"
        )
    if len(metrics["rounds"]) != rounds + 1 or failure is not None:
        raise RunFailedError(
            f"the federation stopped after {max(0, len(metrics['rounds']) - 1)} of {rounds} "
            f"rounds ({getattr(failure, 'reason', None) or failure or 'incomplete report'}); see "
            "the log above and "
            f"{Path(run_dir) / 'superlink.log'}"
        )
    return metrics
