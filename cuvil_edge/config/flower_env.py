"""How cuvil-edge starts Flower's processes and CLI (shared by coordinator and agent).

Quiet, offline (no telemetry, no update checks, no run-time installs), with ``FLWR_HOME`` inside
the given home so nothing is written to the user's own Flower directory.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from cuvil_edge.errors import MissingDependencyError

FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def flwr_env(home: Path) -> dict[str, str]:
    """The environment for Flower processes started on behalf of ``home``; Flower starts its own
    helpers (``flower-superexec``, ``flwr-clientapp``) by name, so this Python's scripts come first."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(Path(home) / "flwr"), "PATH": path}


def flower_tool(name: str) -> str:
    """The path of one of Flower's commands, preferring the one beside this Python.

    Raises:
        MissingDependencyError: it is not installed (a ConfigError); a device's SuperNode comes
            with ``cuvil-edge[agent]``, the SuperLink and ``flwr`` with ``cuvil-edge[coordinator]``.
    """
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise MissingDependencyError(
            f"`{name}` comes with Flower 1.42, which this install lacks",
            "agent" if name == "flower-supernode" else "coordinator",
        )
    return found
