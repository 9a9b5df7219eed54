"""`cuvil-edge runs` and `cuvil-edge stop RUN`: the SuperLink's runs, asked over its Control API
(what `flwr ls` and `flwr stop` ask; coordinator/control_api.py). A failure is a
:class:`DeploymentError` with Flower's message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuvil_edge.coordinator import control_api
from cuvil_edge.coordinator.superlink import CONNECTION, DeploymentError


@dataclass(frozen=True)
class RunInfo:
    run_id: int
    status: str  # "running", "finished:completed", "finished:failed", "finished:stopped", ...
    app: str
    elapsed: str
    since: str  # when it reached its status (ISO 8601, UTC)


def _configured(home: Path) -> Path:
    if not control_api.config_file(home).exists():
        raise DeploymentError(
            f"no SuperLink is configured in {home}; start one there with `cuvil-edge coordinator serve`"
        )
    return home


def list_runs(home: Path) -> list[RunInfo]:
    """The runs the SuperLink of ``home`` knows, oldest first.

    Raises:
        DeploymentError: no SuperLink is configured there, or it is not reachable.
    """
    runs = []
    for r in control_api.runs(_configured(home), CONNECTION):
        app = f"{r.get('fab-id', '')}=={r.get('fab-version', '')}".strip("=")
        since = next((str(r[k]) for k in ("finished-at", "running-at", "starting-at", "pending-at") if r.get(k)), "")
        runs.append(RunInfo(int(r.get("run-id", 0)), str(r.get("status", "?")), app, str(r.get("elapsed", "")), since))
    return sorted(runs, key=lambda r: r.run_id)


def stop_run(home: Path, run_id: int) -> None:
    """Ask the SuperLink to stop ``run_id``.

    Raises:
        DeploymentError: no such run, it has already finished, or the SuperLink is not reachable.
    """
    known = {r.run_id: r for r in list_runs(home)}
    if run_id not in known:
        raise DeploymentError(f"the SuperLink has no run {run_id}; `cuvil-edge runs` lists them")
    if known[run_id].status.startswith("finished"):
        raise DeploymentError(f"run {run_id} has already ended ({known[run_id].status})")
    control_api.stop_run(home, CONNECTION, run_id)
