"""Flower's deployment engine on 127.0.0.1: a TLS SuperLink with node authentication, three enrolled
devices and one rogue (issue 10 item 6 a, b, d). Every process started here is stopped by PID."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from cuvil_edge.agent.daemon import REFUSED_MARK, supernode_command
from cuvil_edge.agent.enroll import init_site
from cuvil_edge.config import load_federation, load_site
from cuvil_edge.config.flower_env import flower_tool, flwr_env
from cuvil_edge.coordinator.registry import SiteRegistry, init_home
from cuvil_edge.coordinator.status import federation_status
from cuvil_edge.coordinator.superlink import CONNECTION, start_superlink, submit_run
from cuvil_edge.coordinator.tls import make_certs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _configs(tmp_path: Path) -> Path:
    """The demo federation with one local epoch per round (the test is about the engine)."""
    (tmp_path / "configs" / "sites").mkdir(parents=True)
    for site in (ROOT / "configs" / "sites").glob("*.yaml"):
        text = re.sub(r"local_epochs: \d+", "local_epochs: 1", site.read_text())
        (tmp_path / "configs" / "sites" / site.name).write_text(text)
    fed = tmp_path / "configs" / "federation.yaml"
    fed.write_text((ROOT / "configs" / "federation.yaml").read_text())
    return fed


def _online(home: Path) -> int:
    out = subprocess.run([flower_tool("flwr"), "supernode", "list", CONNECTION, "--format", "json"],
                         env=flwr_env(home), capture_output=True, text=True, timeout=60)
    try:
        return sum(n.get("status") == "online" for n in json.loads(out.stdout).get("nodes", []))
    except ValueError:
        return 0


def test_enrolled_devices_run_a_rogue_is_refused_and_a_killed_coordinator_resumes(tmp_path):
    fed_path = _configs(tmp_path)
    home = init_home(tmp_path / "coordinator")
    make_certs(home / "tls", ["127.0.0.1"])
    site_files = load_federation(fed_path).sites
    devices = []
    for i, path in enumerate(site_files):
        setup = init_site(load_site(path), home / "keys" / "root.json", ca=home / "tls" / "ca.crt",
                          home=tmp_path / f"device{i}")
        SiteRegistry(home).enroll(setup.enrollment)
        devices.append((path, setup))
    init_site(load_site(site_files[0]), home / "keys" / "root.json", ca=home / "tls" / "ca.crt",
              home=tmp_path / "rogue")  # claims hospital-a with a key nobody enrolled
    address = f"127.0.0.1:{_port()}"
    link = start_superlink(home, address, log_file=tmp_path / "superlink.log")
    nodes: list[subprocess.Popen] = []
    try:
        for i, (path, _) in enumerate(devices):
            command = supernode_command(load_site(path), path, tmp_path / f"device{i}", address, _port(),
                                        (i, len(devices)))
            nodes.append(subprocess.Popen(command, env=flwr_env(tmp_path / f"device{i}"),
                                          stdout=open(tmp_path / f"node{i}.log", "wb"), stderr=subprocess.STDOUT))
        rogue_cmd = supernode_command(load_site(site_files[0]), site_files[0], tmp_path / "rogue", address, _port())
        rogue_proc = subprocess.Popen(rogue_cmd, env=flwr_env(tmp_path / "rogue"),
                                      stdout=open(tmp_path / "rogue.log", "wb"), stderr=subprocess.STDOUT)
        nodes.append(rogue_proc)
        assert rogue_proc.wait(timeout=120) != 0  # (b) an unregistered key is refused
        assert REFUSED_MARK in (tmp_path / "rogue.log").read_text(errors="replace")
        deadline = time.monotonic() + 120
        while _online(home) < len(devices) and time.monotonic() < deadline:
            time.sleep(1)
        assert _online(home) == len(devices)

        assert submit_run(home, fed_path, rounds=2, timeout=900) == "finished:completed"  # (a)
        registry = json.loads((home / "sites.json").read_text())["sites"]
        assert all(entry.get("node_id") for entry in registry.values())
        st = federation_status(home)  # `cuvil-edge status`
        assert st.superlink == "reachable" and st.last_round == 2
        assert all(s.registered and s.online and s.eps_spent > 0 for s in st.sites)

        # (d) the coordinator is killed between rounds and restarted: same keys, counters and
        # registrations; the run resumes from the last checkpoint and the devices accept its packages
        link.kill()
        link.wait(timeout=30)
        link = start_superlink(home, address, log_file=tmp_path / "superlink2.log")
        deadline = time.monotonic() + 180
        while _online(home) < len(devices) and time.monotonic() < deadline:
            time.sleep(2)
        assert _online(home) == len(devices)
        assert submit_run(home, fed_path, rounds=3, timeout=900, resume=True) == "finished:completed"
    finally:
        for proc in nodes + [link]:
            if proc.poll() is None:
                proc.terminate()
        for proc in nodes + [link]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    first_run, resumed_run = sorted((home / "runs").iterdir())
    rounds = json.loads((first_run / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for stats in rounds[-1]["sites"].values():
        assert stats["status"] == "ok" and stats["eps-spent"] > 0
    after = json.loads((resumed_run / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in after] == [2, 3] and after[0]["global_accuracy"] == rounds[-1]["global_accuracy"]
    for site, stats in after[-1]["sites"].items():
        assert stats["status"] == "ok", (site, stats)
        assert stats["eps-spent"] > rounds[-1]["sites"][site]["eps-spent"]  # the same ledger, spent further
    for i, (_, setup) in enumerate(devices):  # each device kept its own, sealed packages and its own ledger
        kept = list((setup.state_dir / "packages").glob("*.cpkg"))
        assert kept and all(b"CUVLIRC" not in p.read_bytes() for p in kept)
        assert (setup.state_dir / "ledger.sqlite").exists()
