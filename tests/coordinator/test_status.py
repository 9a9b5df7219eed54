"""`cuvil-edge status` says whether the SuperLink answered, and exits non-zero when it did not."""

from __future__ import annotations

import pytest

from cuvil_edge.cli.main import main
from cuvil_edge.coordinator import control_api
from cuvil_edge.coordinator.control_api import ControlAPIError
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
    st = federation_status(home)  # a real request, to a port nothing listens on

    assert st.reachable is False and st.superlink.startswith("not reachable (")
    assert "unavailable" in st.superlink and "\n" not in st.superlink
    assert main(["status", "--home", str(home)]) == SUPERLINK_DOWN_EXIT != 0
    out = capsys.readouterr().out
    assert "SuperLink: not reachable (" in out and "reachable;" not in out.replace("not reachable", "")


def _nodes(*listed):
    def nodes(home, connection):
        return list(listed)
    return nodes


def _raises(error):
    def nodes(home, connection):
        raise error
    return nodes


#: (what asking the SuperLink for its nodes does, whether status calls it reachable, a fragment of what it says)
ANSWERS = [
    ("online", _nodes({"node-id": "7", "status": "online"}, {"node-id": "8", "status": "offline"}), True,
     "reachable"),
    ("refused", _raises(ControlAPIError("the SuperLink did not answer `flwr supernode list`: Connection "
                                        "refused by peer.")), False, "Connection refused by peer.)"),
    ("not-a-flower-error", _raises(RuntimeError("boom")), False, "not reachable (RuntimeError: boom)"),
    ("escapes", _raises(ControlAPIError("bad \x1b[2J thing")), False, "bad \\x1b[2J thing"),
]


@pytest.mark.parametrize("name, nodes, reachable, says", ANSWERS, ids=[a[0] for a in ANSWERS])
def test_only_an_answer_counts_as_reachable(home, monkeypatch, capsys, name, nodes, reachable, says):
    monkeypatch.setattr(control_api, "nodes", nodes)

    st = federation_status(home)
    code = main(["status", "--home", str(home)])

    assert st.reachable is reachable and says in st.superlink and "\n" not in st.superlink
    assert code == (0 if reachable else SUPERLINK_DOWN_EXIT)
    assert f"SuperLink: {'reachable' if reachable else 'not reachable ('}" in capsys.readouterr().out


def test_a_ca_that_cannot_be_read_is_reported_not_reachable(home):
    (home / "tls" / "ca.crt").unlink()

    st = federation_status(home)

    assert st.reachable is False and "CA" in st.superlink and "ca.crt" in st.superlink


def test_a_home_that_never_started_a_superlink_is_not_an_outage(tmp_path):
    home = init_home(tmp_path / "home")

    st = federation_status(home)

    assert st.reachable is None and "not started here" in st.superlink
    assert main(["status", "--home", str(home)]) == 0
