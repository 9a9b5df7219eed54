"""Attacks on the deployment surface (docs/DEPLOYMENT.md, threat model), on Flower's deployment
engine on 127.0.0.1: a coordinator behind its Fleet gateway and three enrolled devices, started
once for the module and stopped by PID afterwards.

The attacker's app (tests/e2e/foreign_app) writes a marker file from its ServerApp and from its
ClientApp if either ever runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cuvil_edge.agent.app_gate import APP_REFUSED_CODE
from cuvil_edge.cli.local_federation import APP_DIR, local_federation
from cuvil_edge.config.flower_env import flower_tool, flwr_env
from cuvil_edge.coordinator.superlink import CONNECTION, flwr_cli, submit_run

ROOT = Path(__file__).resolve().parents[2]
FOREIGN_APP = Path(__file__).resolve().parent / "foreign_app"
#: one worker runs the whole module: its federation (the module fixture) is started once
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("deployment-attacks")]


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    (tmp / "configs" / "sites").mkdir(parents=True)
    for site in (ROOT / "configs" / "sites").glob("*.yaml"):
        text = re.sub(r"local_epochs: \d+", "local_epochs: 1", site.read_text())
        (tmp / "configs" / "sites" / site.name).write_text(text)
    federation = tmp / "configs" / "federation.yaml"
    federation.write_text((ROOT / "configs" / "federation.yaml").read_text())
    with local_federation(tmp / "deployment", federation) as running:
        running.federation, running.root, running.tmp = federation, tmp / "deployment", tmp
        yield running


def _foreign_run(home: Path, connection: str, tmp: Path, timeout: float = 240) -> tuple[subprocess.CompletedProcess,
                                                                                       dict[str, Path]]:
    """`flwr run` of the attacker's app through ``connection`` of the `flwr` configuration in ``home``."""
    marks = {k: tmp / f"{k}.txt" for k in ("server-marker", "client-marker", "replies")}
    app = tmp / "foreign_app"
    if not app.exists():
        shutil.copytree(FOREIGN_APP, app)
    config = " ".join(f"{k}='{v}'" for k, v in marks.items())
    proc = subprocess.run([flower_tool("flwr"), "run", str(app), connection, "--stream", "--run-config", config],
                          env=flwr_env(home), capture_output=True, text=True, timeout=timeout)
    return proc, marks


def test_a_foreign_app_on_the_device_port_is_refused(fed, tmp_path):
    """A network attacker holds the device-facing address and the public ca.crt every device has:
    `flwr run` of its own app there reaches no Control API, and its ServerApp never runs."""
    attacker = tmp_path / "attacker"
    (attacker / "flwr").mkdir(parents=True)
    shutil.copy(fed.home / "tls" / "ca.crt", attacker / "ca.crt")
    (attacker / "flwr" / "config.toml").write_text(
        f'[superlink]\ndefault = "attack"\n\n[superlink.attack]\naddress = "{fed.address}"\n'
        f'root-certificates = "{attacker / "ca.crt"}"\n')
    proc, marks = _foreign_run(attacker, "attack", tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    listed = flwr_cli(attacker, "ls", "attack", "--format", "json")
    assert '"success": true' not in listed.stdout
    runs = json.loads(flwr_cli(fed.home, "ls", CONNECTION, "--format", "json").stdout)["runs"]
    assert all("attacker" not in str(r.get("fab-id", "")) for r in runs), runs  # nothing was even submitted
    assert not marks["server-marker"].exists()


def _runs(home: Path) -> list[dict]:
    return json.loads(flwr_cli(home, "ls", CONNECTION, "--format", "json").stdout)["runs"]


def test_a_foreign_app_from_a_local_user_never_runs_on_the_coordinator(fed, tmp_path):
    """A process on the coordinator host reaches the loopback Control API (it authenticates
    nobody) and submits its app: the coordinator's executor refuses the run before installing
    anything of it, the run ends failed with the reason, and its ServerApp never runs."""
    proc, marks = _foreign_run(fed.home, CONNECTION, tmp_path)
    assert not marks["server-marker"].exists(), proc.stdout + proc.stderr
    [run] = [r for r in _runs(fed.home) if "attacker" in str(r.get("fab-id", ""))]
    assert run["status"] == "finished:failed", run
    assert "refused by the coordinator" in (fed.root / "superlink.log").read_text(errors="replace")
    assert not marks["client-marker"].exists()


def test_a_foreign_app_from_a_compromised_operator_is_refused_on_every_device(fed, tmp_path):
    """A stolen operator account can do what the coordinator's user can: here it swaps the
    executor for Flower's own (which runs any app) using the secret it can read, and submits its
    app. Its ServerApp runs on the coordinator, but every device refuses the run before importing
    any of it, says so in its log, and answers with a typed refusal; its ClientApp never runs."""
    from cuvil_edge.coordinator.superlink import secret_file, superexec_command

    home, address = fed.home, fed.superlink.operator_address
    fed.superlink.superexec.terminate()
    fed.superlink.superexec.wait(timeout=30)
    stock = subprocess.Popen([flower_tool("flower-superexec"), "--runtime-api-address", address, "--root-certificates",
                              str(home / "tls" / "ca.crt"), "--superexec-auth-secret-file", str(secret_file(home))],
                             env=flwr_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        proc, marks = _foreign_run(home, CONNECTION, tmp_path)
    finally:
        stock.terminate()
        stock.wait(timeout=30)
        fed.superlink.superexec = subprocess.Popen(superexec_command(home, address), env=flwr_env(home),
                                                   start_new_session=True)  # as start_superlink does
    assert marks["server-marker"].exists(), proc.stdout + proc.stderr
    assert not marks["client-marker"].exists()
    answers = json.loads(marks["replies"].read_text())
    assert len(answers) == 3 and all(a["error"] == APP_REFUSED_CODE for a in answers), answers
    assert all("not the cuvil-edge app installed here" in a["reason"] for a in answers)
    logs = [(fed.root / f"supernode-{i}.log").read_text(errors="replace") for i in range(3)]
    assert all("refused run" in log and "attacker" in log for log in logs)


def test_the_runtime_apis_need_the_executor_secret(fed):
    """A process on the coordinator or a device that reaches a Runtime API without the secret
    cannot take tasks (which would hand it every run's inputs)."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.runtime import RuntimeHttpClient

    ports = [int(p.args[p.args.index("--port") + 1]) for p in fed.supernodes]
    targets = [(fed.superlink.operator_address, False)] + [(f"127.0.0.1:{port}", True) for port in ports]
    for address, insecure in targets:
        client = RuntimeHttpClient.from_server_address(
            server_address=address, insecure=insecure,
            root_certificates=None if insecure else (fed.home / "tls" / "ca.crt").read_bytes(), interceptors=[])
        with pytest.raises(Exception, match="(?i)auth|401|403"):
            client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.SERVER_APP, TaskType.CLIENT_APP],
                                                  agentapp_fab_hashes=[]))
        client.close()


def test_genuine_rounds_still_complete_beside_the_refused_runs(fed):
    assert submit_run(fed.home, APP_DIR, fed.federation, rounds=1, timeout=600) == "finished:completed"
    [run] = (fed.home / "runs").iterdir()
    [last] = [r for r in json.loads((run / "metrics.json").read_text())["rounds"] if r["round"] == 1]
    assert all(s["status"] == "ok" for s in last["sites"].values()), last["sites"]
