"""`cuvil-edge runs`, `stop` and `run` without a SuperLink: one line saying what is missing, exit 2,
never a traceback, a false "no runs" or a run submitted to nothing. The e2e deployment test lists
and stops runs on a real one."""

from __future__ import annotations

import socket
from pathlib import Path

from cuvil_edge.cli.main import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FEDERATION = Path(__file__).resolve().parents[2] / "configs" / "federation.yaml"


def test_a_home_without_a_superlink_says_how_to_start_one(tmp_path, capsys):
    for command in (["runs"], ["stop", "3"], ["run", "--federation", str(FEDERATION)]):
        assert main([*command, "--home", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "coordinator serve" in err


def test_a_superlink_that_is_down_is_named_not_reachable(tmp_path, capsys):
    """`flwr ls` exits 0 with ``{"success": false}`` when nothing listens; that is an error here."""
    (tmp_path / "flwr").mkdir()
    (tmp_path / "flwr" / "config.toml").write_text(
        f'[superlink]\ndefault = "cuvil"\n\n[superlink.cuvil]\naddress = "127.0.0.1:{_free_port()}"\n'
        'insecure = true\n')
    for command in (["runs"], ["run", "--federation", str(FEDERATION)]):
        assert main([*command, "--home", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "did not answer" in err and "unavailable" in err
