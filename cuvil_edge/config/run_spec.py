"""The run spec: what the launcher tells the Flower apps about one run.

In simulation (`cuvil-edge demo`) the launcher writes this small JSON file and names it in Flower's
``run_config`` (key :data:`RUN_CONFIG_KEY`), which both apps receive; on the deployment engine
(`cuvil-edge run`) the ServerApp builds it from the run config's ``federation`` and ``home``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from cuvil_edge.errors import ConfigError

#: The run-config key naming the run spec file of a simulated run.
RUN_CONFIG_KEY = "run-spec"


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
    def from_run_config(config: dict) -> RunSpec:
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
        return RunSpec(
            federation=str(config["federation"]),
            run_dir=str(run_dir),
            home=str(home),
            coordinator_key=str(keys / "coordinator.key"),
            trust_root=str(keys / "root.json"),
            rounds=rounds,
        )

    @staticmethod
    def load(path: str | Path) -> RunSpec:
        """Read a run spec file written by :meth:`save`.

        Raises:
            ConfigError: the file is missing or invalid.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return RunSpec(**data)
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(
                f"{path}: invalid run spec ({e}); start runs with `cuvil-edge demo` or `cuvil-edge run`"
            ) from e

    @staticmethod
    def of_simulation(run_config: dict) -> RunSpec:
        """The spec of a simulated run, named by its run config.

        Raises:
            ConfigError: the run config names no spec, or the file is unusable.
        """
        path = run_config.get(RUN_CONFIG_KEY)
        if not path:
            raise ConfigError(f"the run config has no {RUN_CONFIG_KEY!r}; start simulated runs with `cuvil-edge demo`")
        return RunSpec.load(str(path))
