"""The SuperLink's Control API asked from this process (coordinator/control_api.py) answers as the
`flwr` CLI does, on a real SuperLink on 127.0.0.1 with TLS; a SuperLink that is down, a CA that is
not the coordinator's and refusals are typed errors with Flower's words. Every process started here
is stopped by PID."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cuvil_edge.agent.enroll import init_site
from cuvil_edge.config import load_site
from cuvil_edge.config.home import keys_dir
from cuvil_edge.coordinator import control_api
from cuvil_edge.coordinator.control_api import ControlAPIError
from cuvil_edge.coordinator.registry import SiteRegistry, init_home
from cuvil_edge.coordinator.superlink import CONNECTION, flwr_cli, free_port, start_superlink, write_connection
from cuvil_edge.coordinator.tls import make_certs
from cuvil_edge.errors import DeploymentError

SITES = Path(__file__).resolve().parents[2] / "configs" / "sites"


def _cli_json(home: Path, *args: str) -> dict:
    return json.loads(flwr_cli(home, *args, CONNECTION, "--format", "json").stdout)


@pytest.fixture(scope="module")
def link(tmp_path_factory):
    """A SuperLink whose home has one enrolled site (hospital-a), registered at start-up."""
    root = tmp_path_factory.mktemp("control")
    home = init_home(root / "coordinator")
    make_certs(home / "tls", ["127.0.0.1"])
    setup = init_site(load_site(SITES / "hospital-a.yaml"), keys_dir(home) / "root.json",
                      ca=home / "tls" / "ca.crt", home=root / "device")
    SiteRegistry(home).enroll(setup.enrollment)
    coordinator = start_superlink(home, f"127.0.0.1:{free_port()}", log_file=root / "superlink.log",
                                  operator_address=f"127.0.0.1:{free_port()}")
    try:
        yield home
    finally:
        coordinator.terminate()


def test_nodes_and_runs_are_what_the_flwr_cli_lists(link):
    nodes, runs = control_api.nodes(link, CONNECTION), control_api.runs(link, CONNECTION)
    cli_nodes, cli_runs = _cli_json(link, "supernode", "list")["nodes"], _cli_json(link, "ls")["runs"]

    node_id = SiteRegistry(link).sites()["hospital-a"]["node_id"]
    assert [n["node-id"] for n in nodes] == [str(node_id)] == [n["node-id"] for n in cli_nodes]
    for ours, theirs in zip(nodes, cli_nodes, strict=True):  # the seconds online move between the two asks
        assert ours.keys() == theirs.keys() and {**ours, "online-elapsed": 0} == {**theirs, "online-elapsed": 0}
    assert runs == cli_runs == []


def test_a_registered_key_is_refused_the_second_time_with_flowers_reason(link):
    key = (link / "flwr" / "hospital-a.pub").read_bytes()  # registered by the SuperLink's start-up

    with pytest.raises(ControlAPIError, match="already in use"):
        control_api.register_node(link, CONNECTION, key, "again")
    assert len(control_api.nodes(link, CONNECTION)) == 1


def test_a_new_key_registers_and_unregistering_it_removes_it(link, tmp_path):
    setup = init_site(load_site(SITES / "factory-b.yaml"), keys_dir(link) / "root.json",
                      ca=link / "tls" / "ca.crt", home=tmp_path / "other")
    node_id = control_api.register_node(link, CONNECTION, setup.enrollment.node_public_key.encode(), "other")
    [new] = [n for n in control_api.nodes(link, CONNECTION) if n["node-id"] == node_id]
    assert new["status"] == "registered" and new == [n for n in _cli_json(link, "supernode", "list")["nodes"]
                                                     if n["node-id"] == node_id][0]

    control_api.unregister_node(link, CONNECTION, node_id)

    [gone] = [n for n in control_api.nodes(link, CONNECTION) if n["node-id"] == node_id]
    assert gone["status"] == "unregistered"
    with pytest.raises(ControlAPIError):  # once only
        control_api.unregister_node(link, CONNECTION, node_id)


@pytest.mark.parametrize("key", [b"", b"not a key", b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9wZW5zc2gta2V5LXYxAAAAAAAAAAAAAAAA"])
def test_a_key_that_is_not_an_elliptic_curve_public_key_is_refused_before_asking(link, key):
    with pytest.raises(ControlAPIError, match="node key of 'x'"):
        control_api.register_node(link, CONNECTION, key, "x")


def test_stopping_a_run_the_superlink_does_not_have_is_refused(link):
    with pytest.raises(ControlAPIError, match="flwr stop"):
        control_api.stop_run(link, CONNECTION, 12345)


def test_a_superlink_with_another_ca_is_not_trusted(link, tmp_path):
    """A listener with a certificate the coordinator's CA did not sign (an impersonator on the
    operator port) gets no request answered: the pinned CA is another."""
    other = init_home(tmp_path / "other")
    make_certs(other / "tls", ["127.0.0.1"])
    config = control_api.config_file(link).read_text(encoding="utf-8")
    write_connection(other, config.split('address = "')[1].split('"')[0])  # the real SuperLink, another CA

    with pytest.raises(ControlAPIError, match="flwr supernode list"):
        control_api.nodes(other, CONNECTION)


def test_a_superlink_that_is_down_or_not_configured_is_a_deployment_error(tmp_path):
    home = init_home(tmp_path / "home")
    with pytest.raises(DeploymentError, match="no SuperLink connection 'cuvil'"):
        control_api.runs(home, CONNECTION)
    make_certs(home / "tls", ["127.0.0.1"])
    write_connection(home, f"127.0.0.1:{free_port()}")

    with pytest.raises(DeploymentError, match="unavailable") as refused:
        control_api.runs(home, CONNECTION)
    cli = _cli_json(home, "ls")  # the CLI concludes the same, in the same words
    assert cli["success"] is False and cli["error-message"].strip().splitlines()[-1] in str(refused.value)


def test_an_unknown_connection_name_is_named(link):
    with pytest.raises(ControlAPIError, match="no SuperLink connection 'elsewhere'"):
        control_api.nodes(link, "elsewhere")


def test_the_control_api_is_not_asked_through_a_flwr_process(link, monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", no_process)

    assert control_api.nodes(link, CONNECTION) and control_api.runs(link, CONNECTION) == []
