"""The run spec: what the launcher tells the Flower apps about one run.

Flower's simulation engine gives apps an empty ``run_config``, so the launcher
writes this small JSON file and points both apps at it through the
``CUVIL_EDGE_RUN_SPEC`` environment variable (which reaches the Ray actors).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from cuvil_edge.errors import ConfigError

ENV_VAR = "CUVIL_EDGE_RUN_SPEC"


@dataclass(frozen=True)
class RunSpec:
    federation: str  # path of the federation YAML
    run_dir: str  # this run's reports (metrics.json, metrics.png)
    home: str  # the durable home: keys, version counters, site state (config/home.py)
    coordinator_key: str  # private key (coordinator side only)
    trust_root: str  # root.json, pinned by every agent
    rounds: int  # rounds this run drives
    start_round: int = 0  # > 0: resumed after this round's checkpoint (coordinator/checkpoints.py)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True), encoding="utf-8")

    @staticmethod
    def from_run_config(config: dict) -> "RunSpec":
        """The spec of a run submitted to the deployment engine (`cuvil-edge run`): the coordinator's
        federation file and home come in Flower's ``run_config``; keys and counters are the home's.

        Raises:
            ConfigError: ``federation`` or ``home`` is missing.
        """
        import time

        if not config.get("federation") or not config.get("home"):
            raise ConfigError("the run config needs federation and home (submit runs with `cuvil-edge run`)")
        home = Path(str(config["home"]))
        keys = home / "keys"
        run_dir = home / "runs" / time.strftime("run-%Y%m%d-%H%M%S")
        run_dir.mkdir(parents=True, exist_ok=True)
        rounds = int(config.get("rounds", 0) or 0)
        if rounds <= 0:
            from cuvil_edge.config.federation import load_federation

            rounds = load_federation(str(config["federation"])).rounds
        return RunSpec(federation=str(config["federation"]), run_dir=str(run_dir), home=str(home),
                       coordinator_key=str(keys / "coordinator.key"), trust_root=str(keys / "root.json"),
                       rounds=rounds)

    @staticmethod
    def from_env() -> "RunSpec":
        """Read the spec named by ``$CUVIL_EDGE_RUN_SPEC``.

        Raises:
            ConfigError: the variable is unset or the file is missing/invalid.
        """
        path = os.environ.get(ENV_VAR)
        if not path:
            raise ConfigError(f"${ENV_VAR} is not set; start runs with `cuvil-edge demo` or `cuvil-edge run`")
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return RunSpec(**data)
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(f"{path}: invalid run spec ({e})") from e

