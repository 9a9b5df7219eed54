"""`cuvil-edge status` says whether the SuperLink answered, and exits non-zero when it did not."""

from __future__ import annotations

import json
import subprocess

import pytest

from cuvil_edge.cli.main import main
from cuvil_edge.coordinator import superlink
from cuvil_edge.coordinator.registry import init_home
from cuvil_edge.coordinator.status import SUPERLINK_DOWN_EXIT, federation_status
from cuvil_edge.coordinator.superlink import free_port, write_connection
from cuvil_edge.coordinator.tls import make_certs


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A coordinator home whose `flwr` connection points at a loopback port nothing listens on."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home" / "flwr"))
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    home = init_home(tmp_path / "home")
    make_certs(home / "tls", ["127.0.0.1"])
    write_connection(home, f"127.0.0.1:{free_port()}")
    return home


def test_a_stopped_superlink_is_reported_not_reachable_with_flowers_reason(home, capsys):
    st = federation_status(home)  # the real `flwr supernode list`: it exits 0 with {"success": false}

    assert st.reachable is False and st.superlink.startswith("not reachable (")
    assert "unavailable" in st.superlink and "\n" not in st.superlink
    assert main(["status", "--home", str(home)]) == SUPERLINK_DOWN_EXIT != 0
    out = capsys.readouterr().out
    assert "SuperLink: not reachable (" in out and "reachable;" not in out.replace("not reachable", "")


def _answer(stdout: str = "", stderr: str = "", returncode: int = 0):
    def flwr_cli(home, *args, timeout=120):
        return subprocess.CompletedProcess(["flwr", *args], returncode, stdout, stderr)
    return flwr_cli


def _timeout(home, *args, timeout=120):
    raise subprocess.TimeoutExpired(["flwr", *args], timeout)


ONLINE = json.dumps({"success": True, "nodes": [{"node-id": 7, "status": "online"},
                                                {"node-id": 8, "status": "offline"}]})

#: (what `flwr supernode list` does, whether status calls the SuperLink reachable, a fragment of what it says)
ANSWERS = [
    ("online", _answer(ONLINE), True, "reachable"),
    ("success-false", _answer(json.dumps({"success": False, "error-message":
                                          "Using SuperLink: cuvil\n\nConnection refused by peer."})),
     False, "not reachable (Connection refused by peer.)"),
    ("success-missing", _answer(json.dumps({"nodes": []})), False, "not reachable ("),
    ("not-json", _answer("Traceback (most recent call last):\nboom", "", 0), False, "no JSON answer: boom"),
    ("non-zero-exit", _answer("", "usage: flwr ...\nError: no such connection 'cuvil'\n", 2), False,
     "exit 2: Error: no such connection 'cuvil'"),
    ("json-but-non-zero", _answer(json.dumps({"success": True, "nodes": []}), "killed", 1), False,
     "not reachable (killed)"),
    ("timeout", _timeout, False, "did not answer in 30 s"),
    ("escapes", _answer(json.dumps({"success": False, "error-message": "bad \x1b[2J thing"})), False,
     "bad \\x1b[2J thing"),
]


@pytest.mark.parametrize("name, flwr_cli, reachable, says", ANSWERS, ids=[a[0] for a in ANSWERS])
def test_only_a_successful_json_answer_counts_as_reachable(home, monkeypatch, capsys, name, flwr_cli,
                                                           reachable, says):
    monkeypatch.setattr(superlink, "flwr_cli", flwr_cli)

    st = federation_status(home)
    code = main(["status", "--home", str(home)])

    assert st.reachable is reachable and says in st.superlink and "\n" not in st.superlink
    assert code == (0 if reachable else SUPERLINK_DOWN_EXIT)
    assert f"SuperLink: {'reachable' if reachable else 'not reachable ('}" in capsys.readouterr().out


def test_a_home_that_never_started_a_superlink_is_not_an_outage(tmp_path):
    home = init_home(tmp_path / "home")

    st = federation_status(home)

    assert st.reachable is None and "not started here" in st.superlink
    assert main(["status", "--home", str(home)]) == 0
