"""Flower's deployment engine on 127.0.0.1: a TLS SuperLink with node authentication, three enrolled
devices and one rogue (issue 10 item 6 a, b, d). Every process started here is stopped by PID."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from cuvil_edge.agent.daemon import REFUSED_MARK, supernode_command
from cuvil_edge.agent.enroll import init_site
from cuvil_edge.cli.local_federation import APP_DIR, free_port, local_federation
from cuvil_edge.config import load_federation, load_site
from cuvil_edge.config.flower_env import flwr_env
from cuvil_edge.coordinator.status import federation_status
from cuvil_edge.coordinator.superlink import submit_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _configs(tmp_path: Path) -> Path:
    """The demo federation with one local epoch per round (the test is about the engine)."""
    (tmp_path / "configs" / "sites").mkdir(parents=True)
    for site in (ROOT / "configs" / "sites").glob("*.yaml"):
        text = re.sub(r"local_epochs: \d+", "local_epochs: 1", site.read_text())
        (tmp_path / "configs" / "sites" / site.name).write_text(text)
    fed = tmp_path / "configs" / "federation.yaml"
    fed.write_text((ROOT / "configs" / "federation.yaml").read_text())
    return fed


def test_enrolled_devices_run_a_rogue_is_refused_and_a_killed_coordinator_resumes(tmp_path):
    fed_path = _configs(tmp_path)
    with local_federation(tmp_path / "deployment", fed_path) as fed:
        home = fed.home
        # (b) a device claiming hospital-a with a key nobody enrolled is refused
        site_file = load_federation(fed_path).sites[0]
        init_site(load_site(site_file), home / "keys" / "root.json", ca=home / "tls" / "ca.crt",
                  home=tmp_path / "rogue")
        rogue = subprocess.Popen(supernode_command(load_site(site_file), site_file, tmp_path / "rogue", fed.address,
                                                   free_port()),
                                 env=flwr_env(tmp_path / "rogue"), stdout=open(tmp_path / "rogue.log", "wb"),
                                 stderr=subprocess.STDOUT)
        try:
            assert rogue.wait(timeout=120) != 0
        finally:
            if rogue.poll() is None:
                rogue.kill()
        assert REFUSED_MARK in (tmp_path / "rogue.log").read_text(errors="replace")

        # (a) three enrolled devices with TLS and node authentication complete two rounds
        assert submit_run(home, APP_DIR, fed_path, rounds=2, timeout=900) == "finished:completed"
        registry = json.loads((home / "sites.json").read_text())["sites"]
        assert all(entry.get("node_id") for entry in registry.values())
        st = federation_status(home)  # `cuvil-edge status`
        assert st.superlink == "reachable" and st.last_round == 2
        assert all(s.registered and s.online and s.eps_spent > 0 for s in st.sites)

        # (d) the coordinator is killed between rounds and restarted: same keys, counters and
        # registrations; the run resumes from the last checkpoint and the devices accept its packages
        fed.restart_superlink(log_file=tmp_path / "superlink2.log")
        fed.wait_online()
        assert submit_run(home, APP_DIR, fed_path, rounds=3, timeout=900, resume=True) == "finished:completed"
        devices = fed.device_homes

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
    for device in devices:  # each device kept its own, sealed packages and its own ledger
        [state] = (device / "agents").iterdir()
        kept = list((state / "packages").glob("*.cpkg"))
        assert kept and all(b"CUVLIRC" not in p.read_bytes() for p in kept)
        assert (state / "ledger.sqlite").exists()
