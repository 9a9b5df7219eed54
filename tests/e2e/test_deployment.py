"""Flower's deployment engine on 127.0.0.1: a TLS SuperLink with node authentication, three enrolled
devices and one rogue, and a device whose ClientApp and then SuperNode are
killed. Every process started here is stopped by PID."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cuvil_edge.agent.app_gate import TASK_PROCESS_NAME
from cuvil_edge.agent.daemon import REFUSED_MARK, supernode_command
from cuvil_edge.agent.enroll import init_site
from cuvil_edge.cli.local_federation import APP_DIR, free_port, local_federation
from cuvil_edge.config import load_federation, load_site
from cuvil_edge.config.flower_env import flwr_env
from cuvil_edge.coordinator import control_api
from cuvil_edge.coordinator.status import federation_status
from cuvil_edge.coordinator.superlink import CONNECTION, DeploymentError, submit_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _configs(tmp_path: Path, federation_extra: str = "") -> Path:
    """The demo federation with one local epoch per round (the test is about the engine)."""
    (tmp_path / "configs" / "sites").mkdir(parents=True)
    for site in (ROOT / "configs" / "sites").glob("*.yaml"):
        text = re.sub(r"local_epochs: \d+", "local_epochs: 1", site.read_text())
        (tmp_path / "configs" / "sites" / site.name).write_text(text)
    fed = tmp_path / "configs" / "federation.yaml"
    fed.write_text((ROOT / "configs" / "federation.yaml").read_text() + federation_extra)
    return fed


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid`` (Linux /proc)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append((int(entry.name), cmd))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ledger_spent(device: Path, site_file: Path) -> float:
    from cuvil_edge.privacy import PrivacyLedger

    site = load_site(site_file)
    [state] = (device / "agents").iterdir()
    with PrivacyLedger(state / "ledger.sqlite", site=site.site, epsilon_budget=site.privacy.epsilon_budget,
                       delta=site.privacy.delta) as ledger:
        return ledger.spent()


def _train_rows(device: Path) -> list[tuple[str, str]]:
    """(key, status) of the training spends in the device's ledger, read-only (the agent owns it)."""
    import sqlite3

    ledgers = list(device.glob("agents/*/ledger.sqlite"))
    if not ledgers:
        return []
    try:
        with sqlite3.connect(f"file:{ledgers[0]}?mode=ro", uri=True, timeout=1) as conn:
            rows = conn.execute("SELECT idempotency_key, status FROM events").fetchall()
    except sqlite3.Error:
        return []
    return [(key, status) for key, status in rows if key.startswith("train-")]


def _train_claimed(device: Path) -> bool:
    """Whether the device's ledger holds a claimed, not yet committed, training spend."""
    return any(status == "reserved" for _, status in _train_rows(device))


def _wait_rejoined(home: Path, node_id: str, since: float, timeout: float = 300) -> None:
    """Until the node is online in a session opened after ``since`` (a killed node's old session
    still reads "online" until the SuperLink misses its heartbeats)."""
    from datetime import datetime, timezone

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in control_api.nodes(home, CONNECTION):
            if str(node.get("node-id")) == node_id and node.get("status") == "online":
                at = datetime.strptime(str(node.get("online-at")), "%Y-%m-%d %H:%M:%SZ").replace(tzinfo=timezone.utc)
                if at.timestamp() > since:
                    return
        time.sleep(1)
    raise AssertionError(f"node {node_id} did not rejoin within {timeout:.0f} s")


def _accepted_version(device: Path) -> int:
    [state] = (device / "agents").iterdir()
    return max(int(p.name[1:21]) for p in (state / "packages").glob("v*.cpkg"))


def test_enrolled_devices_run_a_rogue_is_refused_and_a_killed_coordinator_resumes(tmp_path, capsys):
    fed_path = _configs(tmp_path)
    with local_federation(tmp_path / "deployment", fed_path) as fed:
        home = fed.home
        # (b, e) a node presenting hospital-a's name (its site file) with its own key, which nobody
        # enrolled, fails authentication while hospital-a's own device is online
        site_file = load_federation(fed_path).sites[0]
        init_site(load_site(site_file), home / "keys" / "root.json", ca=home / "tls" / "ca.crt",
                  home=tmp_path / "rogue")
        rogue = subprocess.Popen(supernode_command(load_site(site_file), site_file, tmp_path / "rogue", fed.address,
                                                   free_port()),
                                 env=flwr_env(tmp_path / "rogue"), stdout=open(tmp_path / "rogue.log", "wb"),
                                 stderr=subprocess.STDOUT)
        try:
            # (a) meanwhile (the rogue's start-up and refusal need no wait of their own), three enrolled
            # devices with TLS and node authentication complete two rounds
            assert submit_run(home, APP_DIR, fed_path, rounds=2, timeout=900) == "finished:completed"
            assert rogue.wait(timeout=120) != 0, "the rogue node was not refused"
        finally:
            if rogue.poll() is None:
                rogue.kill()
        assert REFUSED_MARK in (tmp_path / "rogue.log").read_text(errors="replace")
        registry = json.loads((home / "sites.json").read_text())["sites"]
        assert all(entry.get("node_id") for entry in registry.values())
        st = federation_status(home)  # `cuvil-edge status`
        assert st.superlink == "reachable" and st.last_round == 2
        assert all(s.registered and s.online and s.eps_spent > 0 for s in st.sites)
        # `cuvil-edge runs` lists it; `stop` refuses an ended run and an unknown one, in one line
        from cuvil_edge.cli.main import main as cli
        from cuvil_edge.coordinator.runs import list_runs

        [done] = list_runs(home)
        assert done.status == "finished:completed" and done.app
        capsys.readouterr()
        assert cli(["runs", "--home", str(home)]) == 0 and str(done.run_id) in capsys.readouterr().out
        assert cli(["stop", str(done.run_id), "--home", str(home)]) == 2
        assert "already ended" in capsys.readouterr().err
        assert cli(["stop", str(done.run_id + 1000), "--home", str(home)]) == 2
        assert "no run" in capsys.readouterr().err

        # (d) the coordinator is killed between rounds and restarted: same keys, counters and
        # registrations; the run resumes from the last checkpoint and the devices accept its packages
        fed.restart_superlink(log_file=tmp_path / "superlink2.log")
        fed.wait_online()
        capsys.readouterr()
        assert submit_run(home, APP_DIR, fed_path, rounds=3, timeout=900, resume=True) == "finished:completed"
        shown = capsys.readouterr().out  # the checkpoint's model first, never a table of "no reply"
        assert "resuming digits-demo after round 2 of 3: 1 round left" in shown and "no reply" not in shown, shown
        assert "round 2: global test accuracy" in shown and "round 3: global test accuracy" in shown
        devices = list(fed.device_homes)

        # a lost device (docs/DEPLOYMENT.md §9): its replacement (the rogue's keys) is enrolled with
        # --replace while the SuperLink runs; the lost device's key is withdrawn at once, the new one joins
        old_id = json.loads((home / "sites.json").read_text())["sites"]["hospital-a"]["node_id"]
        [rogue_enrollment] = (tmp_path / "rogue").glob("agents/*/enrollment.json")
        assert cli(["coordinator", "enroll", str(rogue_enrollment), "--home", str(home), "--replace"]) == 0
        new_id = json.loads((home / "sites.json").read_text())["sites"]["hospital-a"]["node_id"]
        assert new_id and new_id != old_id
        listed = control_api.nodes(home, CONNECTION)
        assert all(n["status"] != "online" for n in listed if str(n["node-id"]) == old_id)
        replacement = subprocess.Popen(supernode_command(load_site(site_file), site_file, tmp_path / "rogue",
                                                         fed.address, free_port(), (0, 3)),
                                       env=flwr_env(tmp_path / "rogue"), stdout=open(tmp_path / "new.log", "wb"),
                                       stderr=subprocess.STDOUT)
        fed.supernodes.append(replacement)  # stopped with the others
        _wait_rejoined(home, new_id, since=0, timeout=120)

    first_run, resumed_run = sorted((home / "runs").iterdir())
    rounds = json.loads((first_run / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for stats in rounds[-1]["sites"].values():
        assert stats["status"] == "ok" and stats["eps-spent"] > 0
    after = json.loads((resumed_run / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in after] == [2, 3] and after[0]["global_accuracy"] == rounds[-1]["global_accuracy"]
    assert after[0]["initial"] and not after[1].get("initial")
    for site, stats in after[-1]["sites"].items():
        assert stats["status"] == "ok", (site, stats)
        assert stats["eps-spent"] > rounds[-1]["sites"][site]["eps-spent"]  # the same ledger, spent further
    for device in devices:  # each device kept its own, sealed packages and its own ledger
        [state] = (device / "agents").iterdir()
        kept = list((state / "packages").glob("*.cpkg"))
        assert kept and all(b"CUVLIRC" not in p.read_bytes() for p in kept)
        assert (state / "ledger.sqlite").exists()


def test_a_killed_clientapp_fails_only_its_site_and_a_killed_supernode_rejoins_with_its_state(tmp_path):
    """(c) SIGKILL hospital-a's ClientApp while it trains (after it claimed the round's spend): the
    round completes with the other two, the report names hospital-a as failed (its SuperNode says
    "ClientApp stopped responding"), and the claim stays counted, never spent twice. Then
    SIGKILL its SuperNode and restart it with
    `cuvil-edge agent run`: same node id, it rejoins the next round, its ledger and anti-rollback
    state continue (more ε spent, never less; only newer packages)."""
    fed_path = _configs(tmp_path, "\nmin_sites: 2\n")
    fed_path.write_text(fed_path.read_text().replace("round_timeout: 600", "round_timeout: 150"))
    with local_federation(tmp_path / "deployment", fed_path) as fed:
        home, device = fed.home, fed.device_homes[0]
        outcome: dict = {}

        def first_round():
            try:
                outcome["status"] = submit_run(home, APP_DIR, fed_path, rounds=1, timeout=600)
            except Exception as e:  # noqa: BLE001 - reported below
                outcome["error"] = e

        runner = threading.Thread(target=first_round)
        runner.start()
        killed = None
        deadline = time.monotonic() + 300
        while killed is None and runner.is_alive() and time.monotonic() < deadline:
            apps = [pid for pid, _ in _descendants(fed.gates[0].pid) if _name(pid) == TASK_PROCESS_NAME]
            if apps and _train_claimed(device):  # training: the spend is claimed, the data is in use
                os.kill(apps[0], signal.SIGKILL)
                killed = apps[0]
            time.sleep(0.05)
        runner.join(timeout=600)
        assert killed is not None, "hospital-a's ClientApp was never seen"
        assert outcome.get("status") == "finished:completed", outcome

        [first_run] = (home / "runs").iterdir()
        [r1] = [r for r in json.loads((first_run / "metrics.json").read_text())["rounds"] if r["round"] == 1]
        assert r1["sites"]["hospital-a"]["status"] == "failed", r1["sites"]["hospital-a"]
        assert r1["sites"]["hospital-a"]["train-error"]
        claims = _train_rows(device)  # one claim for round 1, still counted (fail closed), no second spend
        assert [status for key, status in claims if key.startswith("train-r1-")] == ["reserved"], claims
        assert r1["sites"]["factory-b"]["status"] == "ok" and r1["sites"]["fleet-c"]["status"] == "ok"

        site_file = load_federation(fed_path).sites[0]
        spent, version = _ledger_spent(device, site_file), _accepted_version(device)
        node_id = json.loads((home / "sites.json").read_text())["sites"]["hospital-a"]["node_id"]
        killed_at = time.time()
        fed.supernodes[0].kill()  # a crash: its session stays open on the SuperLink for about a minute
        fed.supernodes[0].wait(timeout=30)
        agent = subprocess.Popen([sys.executable, "-m", "cuvil_edge", "agent", "run", "--site", str(site_file),
                                  "--home", str(device), "--superlink", fed.address, "--port", str(free_port()),
                                  "--partition", "0/3"], env=flwr_env(device),
                                 stdout=open(tmp_path / "agent-restarted.log", "wb"), stderr=subprocess.STDOUT)
        fed.supernodes[0] = agent  # stopped (SIGTERM, which stops its SuperNode) with the others

        # while the SuperLink keeps the killed node's old session (about a minute), which no site is
        # needed for: 1 of 1 rounds done, the ServerApp refuses at its start, and we say why
        with pytest.raises(DeploymentError, match="finished:failed") as refused:
            submit_run(home, APP_DIR, fed_path, rounds=1, timeout=600, resume=True)
        assert refused.value.reason.startswith("federation 'digits-demo' already completed 1 of 1 rounds")
        _wait_rejoined(home, node_id, since=killed_at)  # the same node id, in a new session
        assert submit_run(home, APP_DIR, fed_path, rounds=2, timeout=600, resume=True) == "finished:completed"
        second_run = max(r for r in (home / "runs").iterdir() if (r / "metrics.json").exists())
        r2 = json.loads((second_run / "metrics.json").read_text())["rounds"][-1]
        assert r2["round"] == 2 and r2["sites"]["hospital-a"]["status"] == "ok", r2["sites"]["hospital-a"]
        assert _ledger_spent(device, site_file) > spent and r2["sites"]["hospital-a"]["eps-spent"] >= spent
        assert _accepted_version(device) > version
        restarted = [pid for pid, cmd in _descendants(agent.pid) if "flower-supernode" in cmd]
        assert restarted
    assert agent.poll() is not None  # stopping the agent stopped its SuperNode too
    assert all(not Path(f"/proc/{pid}").exists() for pid in restarted)


def _naming(folder: Path) -> list[str]:
    """Command lines of the running processes that name a path under ``folder`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and int(entry.name) != os.getpid() and str(folder) in cmd:
            found.append(cmd)
    return found


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuvil_edge", *args], capture_output=True, text=True, timeout=300)


def _federation_variant(fed_path: Path, name: str, extra: str = "", site: str | None = None) -> Path:
    """A copy of the federation beside it (so its site paths hold), with ``extra`` keys and one more site."""
    text = fed_path.read_text() + extra
    if site:
        text = text.replace("  - sites/fleet-c.yaml\n", f"  - sites/fleet-c.yaml\n  - sites/{site}.yaml\n")
    path = fed_path.with_name(name)
    path.write_text(text)
    return path


def test_run_checks_its_sites_first_and_interrupting_it_or_the_coordinator_stops_everything(tmp_path):
    """Before `cuvil-edge run` submits: a listed site nobody enrolled is refused at once; an enrolled
    one that is offline is waited for up to start_timeout, then refused (all sites needed) or left
    out (min_sites met). Ctrl-C on `run` (SIGINT to its process group, as a terminal sends it) ends
    `flwr run` and stops the run on the SuperLink too. A run's output is its report, not Flower's
    log. The coordinator stopped mid-round (what `serve` does on SIGTERM) is gone within 10 s, its
    ServerApp with it."""
    from cuvil_edge.coordinator.runs import list_runs

    fed_path = _configs(tmp_path)
    fed_path.write_text(fed_path.read_text().replace("start_timeout: 300", "start_timeout: 3"))
    sites = tmp_path / "configs" / "sites"
    stranger = (sites / "fleet-c.yaml").read_text().replace("site: fleet-c", "site: clinic-d")
    (sites / "clinic-d.yaml").write_text(stranger)
    with_stranger = _federation_variant(fed_path, "with-stranger.yaml", site="clinic-d")
    without_one = _federation_variant(fed_path, "min-sites.yaml", "min_sites: 2\n")
    with local_federation(tmp_path / "deployment", fed_path) as fed:
        home = fed.home
        refused = _cli("run", "--federation", str(with_stranger), "--home", str(home))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stdout + refused.stderr
        assert "clinic-d" in refused.stderr and "cuvil-edge coordinator enroll" in refused.stderr

        fed.supernodes[2].terminate()  # fleet-c's device stops
        fed.supernodes[2].wait(timeout=60)
        fleet_c = json.loads((home / "sites.json").read_text())["sites"]["fleet-c"]["node_id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            listed = control_api.nodes(home, CONNECTION)
            if all(n["status"] != "online" for n in listed if str(n["node-id"]) == fleet_c):
                break
            time.sleep(2)
        refused = _cli("run", "--federation", str(fed_path), "--home", str(home))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "waiting up to 3 s for fleet-c (enrolled, offline)" in refused.stdout
        assert "fleet-c is enrolled but offline after 3 s" in refused.stderr and refused.stderr.count("\n") == 1
        assert not list_runs(home)  # nothing reached the SuperLink

        command = [sys.executable, "-m", "cuvil_edge", "run", "--federation", str(without_one), "--home", str(home),
                   "--rounds", "5"]
        # as a terminal starts it: SIGINT at its default, which a test run started in the background
        # (`cmd &` in a non-interactive shell ignores SIGINT, and children inherit that) would not be
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not any(r.status == "running" for r in list_runs(home)):
                time.sleep(1)
            [ours] = list_runs(home)
            assert ours.status == "running", ours
            os.killpg(proc.pid, signal.SIGINT)
            # its handler stops the run on the SuperLink through Flower's CLI, whose start-up alone
            # took over 60 s with three federations on the two cores (parallel workers)
            output, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130, output[-2000:]
        assert f"stopped run {ours.run_id} on the SuperLink" in output
        assert "starting without fleet-c (offline after 3 s; 2 of 3 sites are online" in output
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list_runs(home)[0].status.startswith("finished"):
            time.sleep(1)
        assert list_runs(home)[0].status == "finished:stopped"

        # a run mid-round, and the coordinator stops
        earlier = {key for d in fed.device_homes for key, _ in _train_rows(d)}  # the stopped run's claims

        def training() -> bool:  # a site has claimed this run's spend: packages are out, it trains
            return any(status == "reserved" and key not in earlier for d in fed.device_homes
                       for key, status in _train_rows(d))

        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not any(line.startswith("round 0:") for line in lines):
                assert proc.poll() is None, "".join(lines)
                time.sleep(0.5)
            deadline = time.monotonic() + 120  # round 1, once a site trains (not a fixed pause)
            while time.monotonic() < deadline and not training():
                assert proc.poll() is None, "".join(lines)
                time.sleep(0.2)
            assert training(), "no site started training round 1"
            serverapps = [cmd for cmd in _naming(home) if "flwr-serverapp" in cmd]
            assert serverapps, _naming(home)
            began = time.monotonic()
            fed.superlink.terminate()
            took = time.monotonic() - began
            proc.wait(timeout=120)  # `run` sees its SuperLink gone
        finally:
            if proc.poll() is None:
                proc.kill()
        reader.join(timeout=10)
        assert took < 10, took
        deadline = time.monotonic() + 10
        while _naming(home) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _naming(home) == []  # no ServerApp, executor, gateway or SuperLink of the home is left
        flower_info = [line for line in lines if re.match(r"^(\x1b\[[0-9;]*m)?INFO", line)]
        assert not flower_info and any(line.startswith("round 0: global test accuracy") for line in lines), lines
