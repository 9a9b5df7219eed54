"""`cuvil-edge demo --deployment` from any directory: its default run directory is relative
(runs/<name>-<time>-deployment), and the paths it hands Flower must still hold. Flower's CLI refuses
a relative ``root-certificates`` in its connection file (flwr/cli/typing.py); the ServerApp executor
and each ServerApp are given the CA too. The e2e tests run the whole federation."""

from __future__ import annotations

import tomllib
from pathlib import Path

from flwr.cli.typing import SuperLinkConnection

from cuvil_edge.cli.local_federation import set_up
from cuvil_edge.coordinator.superlink import CONNECTION, superexec_command, write_connection

FED = Path(__file__).resolve().parents[2] / "configs" / "federation.yaml"


def test_a_relative_run_directory_gives_flower_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    home, devices = set_up(Path("runs") / "digits-demo-deployment", FED)  # as the demo's default
    assert not home.is_absolute() and len(devices) == 3

    config = tomllib.loads(write_connection(home, "127.0.0.1:9092").read_text())["superlink"][CONNECTION]
    SuperLinkConnection(CONNECTION, config["address"], config["root-certificates"])  # raises on a relative one
    assert Path(config["root-certificates"]) == (tmp_path / home / "tls" / "ca.crt")

    command = superexec_command(home)
    ca = command[command.index("--root-certificates") + 1]
    monkeypatch.chdir("/")  # the executor hands it to each ServerApp, wherever that runs
    assert Path(ca).is_absolute() and Path(ca).is_file()
