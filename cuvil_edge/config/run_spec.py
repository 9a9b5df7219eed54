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
    rounds: int

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True), encoding="utf-8")

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
