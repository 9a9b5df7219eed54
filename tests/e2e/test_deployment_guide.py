"""docs/DEPLOYMENT.md §1-§4 followed literally, as an operator would type them, on 127.0.0.1: a
coordinator home, one device, enrollment, `coordinator serve` and `agent run` as the daemons the
guide starts, then `cuvil-edge status`. It checks what §4 and §10 promise of the listeners: devices
reach only the Fleet API, the SuperLink answers the operator on loopback, and stopping each
daemon stops every process it started."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cuvil_edge.cli.local_federation import free_port
from cuvil_edge.config.flower_env import flwr_env
from cuvil_edge.coordinator.status import federation_status

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuvil_edge", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=flwr_env(cwd / "flwr-env"))


def _processes_naming(folder: Path) -> list[str]:
    """Command lines of the running processes that name a path under ``folder`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and str(folder) in cmd and "pytest" not in cmd:
            found.append(cmd)
    return found


def test_the_deployment_guide_reaches_an_online_device_and_exposes_only_the_fleet_api(tmp_path):
    coordinator, device = tmp_path / "coordinator", tmp_path / "device"
    coordinator.mkdir()
    device.mkdir()
    shutil.copy(ROOT / "configs" / "sites" / "hospital-a.yaml", device / "site.yaml")
    home = coordinator / "home"
    port, operator = free_port(), free_port()

    # §1 coordinator, §2 device (root.json and ca.crt carried over), §3 enrollment
    assert cli("coordinator", "init", "--home", str(home), cwd=coordinator).returncode == 0
    assert cli("coordinator", "certs", "--home", str(home), "--host", "127.0.0.1", cwd=coordinator).returncode == 0
    shutil.copy(home / "keys" / "root.json", device / "root.json")
    shutil.copy(home / "tls" / "ca.crt", device / "ca.crt")
    done = cli("agent", "init", "--site", "site.yaml", "--trust-root", "root.json", "--ca", "ca.crt", "--home",
               str(device / "home"), cwd=device)
    assert done.returncode == 0, done.stdout + done.stderr
    [enrollment] = (device / "home").glob("agents/*/enrollment.json")
    shutil.copy(enrollment, coordinator / "hospital-a-enrollment.json")
    done = cli("coordinator", "enroll", "hospital-a-enrollment.json", "--home", str(home), cwd=coordinator)
    assert done.returncode == 0, done.stdout + done.stderr

    # §4 the two daemons
    serve = subprocess.Popen([sys.executable, "-m", "cuvil_edge", "coordinator", "serve", "--home", str(home),
                              "--address", f"127.0.0.1:{port}", "--operator-address", f"127.0.0.1:{operator}"],
                             cwd=coordinator, env=flwr_env(coordinator / "flwr-env"), start_new_session=True,
                             stdout=open(tmp_path / "serve.log", "wb"), stderr=subprocess.STDOUT)
    agent = None
    try:
        deadline = time.monotonic() + 120
        while not (home / "flwr" / "config.toml").exists() and time.monotonic() < deadline:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        agent = subprocess.Popen([sys.executable, "-m", "cuvil_edge", "agent", "run", "--site", "site.yaml",
                                  "--home", str(device / "home"), "--superlink", f"127.0.0.1:{port}",
                                  "--port", str(free_port())], cwd=device, env=flwr_env(device / "flwr-env"),
                                 start_new_session=True, stdout=open(tmp_path / "agent.log", "wb"),
                                 stderr=subprocess.STDOUT)
        while time.monotonic() < deadline + 60:
            sites = {s.site: s for s in federation_status(home).sites}
            if sites["hospital-a"].online:
                break
            time.sleep(1)
        status = cli("status", "--home", str(home), cwd=coordinator)
        assert status.returncode == 0 and "hospital-a" in status.stdout, status.stdout + status.stderr
        assert federation_status(home).superlink == "reachable" and sites["hospital-a"].online

        context = ssl.create_default_context(cafile=str(device / "ca.crt"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", context=context, timeout=10) as r:
            assert r.status == 200
        for path in ("/v1/control/list-runs", "/v1/runtime/acquire-task"):  # `flwr run`, `flwr ls`, ServerApp tasks
            request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=b"", method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, context=context, timeout=10)
            assert refused.value.code == 404, path
        listed = subprocess.run([shutil.which("flwr", path=str(Path(sys.executable).parent)), "ls", "cuvil",
                                 "--format", "json"], env=flwr_env(home), capture_output=True, text=True, timeout=120)
        assert '"success": true' in listed.stdout, listed.stdout + listed.stderr  # the operator, on loopback
    finally:
        for daemon in (agent, serve):
            if daemon is not None and daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)  # what `systemctl stop` sends
        for daemon in (agent, serve):
            if daemon is not None:
                daemon.wait(timeout=90)
    deadline = time.monotonic() + 30  # helpers watching their parent exit within a few seconds
    while _processes_naming(tmp_path) and time.monotonic() < deadline:
        time.sleep(1)
    assert _processes_naming(tmp_path) == []  # nothing either daemon started is left
