"""docs/DEPLOYMENT.md followed literally: every walkthrough block (a fenced block whose first line
is ``# on MACHINE``) is run in order, command by command, in a directory standing for that
machine, and files move between machines only by the guide's own ``scp`` lines. The guide reaches a
first round, a status check, a coordinator stopped mid-run and resumed, a device killed and
rejoining, a key rotation and a lost device's replacement, and everything it started stops.

Three machines share 127.0.0.1 here, so the test changes what only the network would: the
coordinator's name and the Fleet port become 127.0.0.1 and a free port, and each daemon gets
its own free local port. The events the guide describes but nobody types (a coordinator stopping
mid-run, a device losing power) are made to happen where the guide describes them."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from cuvil_edge.cli.local_federation import free_port
from cuvil_edge.config.flower_env import flwr_env
from cuvil_edge.coordinator.status import federation_status

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "DEPLOYMENT.md"
pytestmark = pytest.mark.e2e

MACHINES = ("coordinator", "hospital-a", "factory-b", "new-hospital-a")
#: "# on each device" blocks are shown for hospital-a; factory-b runs them with its own names
FACTORY_B = {"hospital-a": "factory-b", "jetson-orin-nano": "rpi4"}
REMOTE = re.compile(r"^(coordinator\.example|hospital-a|factory-b|new-hospital-a):/srv/cuvil-edge/?(.*)$")


@dataclass(frozen=True)
class Step:
    section: str  # "5" for "## 5. Run a federation"
    machine: str
    command: str


def guide_steps(text: str) -> list[Step]:
    """The walkthrough's commands in order: blocks whose first line is exactly ``# on MACHINE``
    (``# on coordinator, when ...`` blocks are for when the reader needs them, not the walk)."""
    steps, section = [], ""
    for part in re.split(r"(^## \d+\.[^\n]*$|^```bash\n.*?^```$)", text, flags=re.M | re.S):
        heading = re.match(r"## (\d+)\.", part)
        if heading:
            section = heading.group(1)
            continue
        block = re.match(r"```bash\n# on ([\w-]+( device)?)\n(.*?)```$", part, re.S)
        if not block:
            continue
        where, body = block.group(1), block.group(3).replace("\\\n", " ")
        machines = ["hospital-a", "factory-b"] if where == "each device" else [where]
        for line in filter(None, (ln.strip() for ln in body.splitlines())):
            for machine in machines:
                command = line
                if where == "each device" and machine == "factory-b":
                    for old, new in FACTORY_B.items():
                        command = command.replace(old, new)
                steps.append(Step(section, machine, command))
    return steps


#: What the walk must contain, in order: (section, machine, the command's first words).
EXPECTED = [
    ("1", "coordinator", "cuvil-edge coordinator init"), ("1", "coordinator", "cuvil-edge coordinator certs"),
    ("1", "coordinator", "scp"), ("1", "coordinator", "scp"),
    ("2", "coordinator", "cuvil-edge coordinator demo-data"), ("2", "coordinator", "scp"), ("2", "coordinator", "scp"),
    ("2", "hospital-a", "cuvil-edge agent new-site"), ("2", "factory-b", "cuvil-edge agent new-site"),
    ("2", "hospital-a", "cuvil-edge agent init"), ("2", "factory-b", "cuvil-edge agent init"),
    ("2", "hospital-a", "scp"), ("2", "factory-b", "scp"),
    ("3", "coordinator", "cuvil-edge coordinator enroll"), ("3", "coordinator", "cuvil-edge coordinator enroll"),
    ("4", "coordinator", "cuvil-edge coordinator serve"),
    ("4", "hospital-a", "cuvil-edge agent run"), ("4", "factory-b", "cuvil-edge agent run"),
    ("4", "coordinator", "cuvil-edge status"),
    ("5", "coordinator", "cuvil-edge coordinator federation"), ("5", "coordinator", "cuvil-edge run"),
    ("5", "coordinator", "cuvil-edge coordinator serve"), ("5", "coordinator", "cuvil-edge run"),
    ("5", "hospital-a", "cuvil-edge privacy status"), ("5", "factory-b", "cuvil-edge privacy status"),
    ("5", "factory-b", "cuvil-edge agent run"),
    ("6", "coordinator", "cuvil-edge keys rotate"), ("6", "coordinator", "cuvil-edge keys show"),
    ("6", "coordinator", "cuvil-edge run"),
    ("9", "coordinator", "cuvil-edge status"), ("9", "coordinator", "scp"), ("9", "coordinator", "scp"),
    ("9", "new-hospital-a", "cuvil-edge agent new-site"), ("9", "new-hospital-a", "cuvil-edge agent init"),
    ("9", "new-hospital-a", "scp"), ("9", "new-hospital-a", "cuvil-edge agent run"),
    ("9", "coordinator", "cuvil-edge coordinator enroll"), ("9", "coordinator", "cuvil-edge run"),
]


def test_the_guide_walkthrough_has_the_steps_this_test_follows():
    steps = guide_steps(GUIDE.read_text(encoding="utf-8"))
    shape = [(s.section, s.machine, " ".join(s.command.split()[:len(c.split())])) for s, (_, _, c) in zip(steps, EXPECTED)]
    assert shape == EXPECTED and len(steps) == len(EXPECTED), [(s.section, s.machine, s.command) for s in steps]


def _processes_naming(folder: Path) -> list[str]:
    """Command lines of the running processes that name a path under ``folder`` (Linux /proc),
    other than this test's own process (``folder`` is under pytest's tmp directory, so no
    filter on the word "pytest" may be used)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmd:
            found.append(cmd)
    return found


class Walk:
    """Three machines as three directories, the guide's commands run in them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dirs = {m: root / m for m in MACHINES}
        for d in self.dirs.values():
            d.mkdir()
        self.fleet, self.operator = free_port(), free_port()
        self.daemons: dict[str, subprocess.Popen] = {}  # "serve", or the machine of an agent
        self.runs = 0
        self.values: dict[str, str] = {}  # the guide's placeholders (LEFT) as the reader would fill them

    @property
    def home(self) -> Path:
        return self.dirs["coordinator"] / "home"

    def argv(self, step: Step) -> list[str]:
        command = step.command
        for name, value in self.values.items():
            command = re.sub(rf"\b{name}\b", value, command)
        command = command.replace("coordinator.example:9093", f"127.0.0.1:{self.fleet}")
        argv = shlex.split(command)
        if argv[:3] == ["cuvil-edge", "coordinator", "serve"]:
            argv[argv.index("--address") + 1] = f"127.0.0.1:{self.fleet}"
            argv += ["--operator-address", f"127.0.0.1:{self.operator}"]
        if argv[:3] == ["cuvil-edge", "agent", "run"]:
            argv += ["--port", str(free_port())]
        return argv

    def env(self, machine: str) -> dict:
        return flwr_env(self.dirs[machine] / "flwr-env")

    def cli(self, machine: str, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "cuvil_edge", *argv[1:]], cwd=self.dirs[machine],
                              capture_output=True, text=True, timeout=900, env=self.env(machine))
        if check:
            assert done.returncode == 0, f"{' '.join(argv)} on {machine}:\n{done.stdout}\n{done.stderr}"
        return done

    def start(self, name: str, machine: str, argv: list[str]) -> subprocess.Popen:
        assert name not in self.daemons or self.daemons[name].poll() is not None, f"{name} is already running"
        log = open(self.root / f"{name}-{len(list(self.root.glob(f'{name}-*.log')))}.log", "wb")
        self.daemons[name] = subprocess.Popen([sys.executable, "-m", "cuvil_edge", *argv[1:]], cwd=self.dirs[machine],
                                              env=self.env(machine), start_new_session=True, stdout=log,
                                              stderr=subprocess.STDOUT)
        return self.daemons[name]

    def scp(self, machine: str, argv: list[str]) -> None:
        def where(arg: str) -> Path:
            remote = REMOTE.match(arg)
            if remote is None:
                return self.dirs[machine] / arg
            host = "coordinator" if remote.group(1) == "coordinator.example" else remote.group(1)
            return self.dirs[host] / remote.group(2)

        *sources, dest = argv[1:]
        target = where(dest)
        for source in sources:
            path = where(source)
            assert path.is_file(), f"scp {source}: no such file on {machine}"
            shutil.copy(path, target / path.name if dest.endswith("/") else target)

    def wait(self, condition, what: str, timeout: float = 240, slowest: float = 1) -> None:
        """Until ``condition()``, looking every second, or (``slowest`` > 1) a second longer after
        each look, up to ``slowest`` s: for a condition that starts `flwr` (about a second of CPU,
        taken from the other workers) while it waits on something slow (a heartbeat timeout)."""
        deadline, pause = time.monotonic() + timeout, 1.0
        while not condition():
            serve = self.daemons.get("serve")
            assert serve is None or serve.poll() is None, f"serve stopped while waiting for {what}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(pause)
            pause = min(pause + 1, slowest)

    def online_since(self, site: str, since: float) -> bool:
        """``site``'s node is online in a session the SuperLink opened after ``since`` (epoch s)."""
        from datetime import datetime, timezone

        from cuvil_edge.coordinator import control_api
        from cuvil_edge.coordinator.superlink import CONNECTION

        node_id = str(json.loads((self.home / "sites.json").read_text())["sites"][site].get("node_id"))
        for node in control_api.nodes(self.home, CONNECTION):
            if str(node.get("node-id")) == node_id and node.get("status") == "online":
                at = datetime.strptime(str(node.get("online-at")), "%Y-%m-%d %H:%M:%SZ").replace(tzinfo=timezone.utc)
                return at.timestamp() > since
        return False

    def online(self, *sites: str) -> bool:
        found = {s.site: s.online for s in federation_status(self.home).sites}
        return all(found.get(s) for s in sites)

    def stop_all(self) -> None:
        for process in self.daemons.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # what `systemctl stop` sends
        for process in self.daemons.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _last_rounds(home: Path) -> list[dict]:
    newest = sorted((home / "runs").glob("run-*"))[-1]
    return json.loads((newest / "metrics.json").read_text())["rounds"]


def test_the_deployment_guide_reaches_rounds_resumes_rejoins_rotates_and_replaces(tmp_path):
    walk = Walk(tmp_path)
    steps = guide_steps(GUIDE.read_text(encoding="utf-8"))
    try:
        for step in steps:
            _do(walk, step)
    finally:
        walk.stop_all()
    deadline = time.monotonic() + 30  # helpers watching their parent exit within a few seconds
    while _processes_naming(tmp_path) and time.monotonic() < deadline:
        time.sleep(1)
    assert _processes_naming(tmp_path) == []  # nothing any daemon started is left


def _do(walk: Walk, step: Step) -> None:
    argv = walk.argv(step)
    words = argv[:3]
    if argv[0] == "scp":
        walk.scp(step.machine, argv)
    elif words == ["cuvil-edge", "coordinator", "serve"]:
        walk.start("serve", step.machine, argv)
        walk.wait(lambda: (walk.home / "flwr" / "config.toml").exists() and
                  federation_status(walk.home).superlink == "reachable", "the SuperLink")
    elif words == ["cuvil-edge", "agent", "run"]:
        since = 0.0
        if step.section == "5":  # "a device that goes down": the guide's event, a power loss
            os.killpg(walk.daemons[step.machine].pid, signal.SIGKILL)
            walk.daemons[step.machine].wait()
            since = time.time()
        walk.start(step.machine, step.machine, argv)
        if step.machine == "new-hospital-a":
            return  # joins once it is enrolled (the next block)
        # a killed node's old session reads "online" until the SuperLink misses its heartbeats
        # (about a minute, §5): rejoined means online in a session opened after the kill
        walk.wait(lambda: walk.online_since(_site(step.machine), since), f"{step.machine} online", timeout=300,
                  slowest=5)
    elif argv[:2] == ["cuvil-edge", "status"]:
        _status(walk, step, argv)
    elif words[:2] == ["cuvil-edge", "run"]:
        _run(walk, step, argv)
    else:
        done = walk.cli(step.machine, argv)
        if words == ["cuvil-edge", "privacy", "status"]:
            assert "ε spent" in done.stdout and "dpsgd" in done.stdout, done.stdout


def _site(machine: str) -> str:
    return "hospital-a" if machine == "new-hospital-a" else machine


def _status(walk: Walk, step: Step, argv: list[str]) -> None:
    if step.section == "4":  # the reader checks once both devices are up
        walk.wait(lambda: walk.online("hospital-a", "factory-b"), "both devices online", timeout=300, slowest=5)
    done = walk.cli(step.machine, argv)
    assert "hospital-a" in done.stdout and "factory-b" in done.stdout, done.stdout
    if step.section == "4":
        _listeners(walk)
    if step.section == "9":  # the ε the lost device left, as the reader reads it from this table
        [lost] = [s for s in federation_status(walk.home).sites if s.site == "hospital-a"]
        assert lost.eps_remaining is not None and lost.eps_remaining > 0
        walk.values["LEFT"] = f"{math.floor(lost.eps_remaining * 100) / 100:.2f}"  # rounded down: never more


def _listeners(walk: Walk) -> None:
    """§4 and §10: devices reach only the Fleet API; the operator reaches the SuperLink on loopback."""
    context = ssl.create_default_context(cafile=str(walk.dirs["hospital-a"] / "ca.crt"))
    with urllib.request.urlopen(f"https://127.0.0.1:{walk.fleet}/health", context=context, timeout=10) as r:
        assert r.status == 200
    for path in ("/v1/control/list-runs", "/v1/runtime/acquire-task"):  # `flwr run`, `flwr ls`, ServerApp tasks
        request = urllib.request.Request(f"https://127.0.0.1:{walk.fleet}{path}", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=10)
        assert refused.value.code == 404, path


def _run(walk: Walk, step: Step, argv: list[str]) -> None:
    walk.runs += 1
    if walk.runs == 1:  # the first run: the coordinator stops mid-run (§5), once round 1 is saved
        run = walk.start("run", step.machine, argv)
        checkpoints = walk.home / "checkpoints"
        walk.wait(lambda: any(checkpoints.glob("*/round-00001.npz")), "round 1's checkpoint", timeout=600)
        serve = walk.daemons["serve"]
        began = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        stopped_in = time.monotonic() - began
        assert stopped_in < 10, f"serve took {stopped_in:.1f} s to stop"
        run.wait(timeout=120)
        assert run.returncode != 0  # its SuperLink went away: the run did not finish
        assert not [p for p in _processes_naming(walk.home) if "flwr-serverapp" in p]
        return
    done = walk.cli(step.machine, argv)
    rounds = _last_rounds(walk.home)
    trained = {site: stats for site, stats in rounds[-1]["sites"].items() if stats["status"] == "ok"}
    assert set(trained) == {"hospital-a", "factory-b"}, (done.stdout, rounds[-1])
    if "--resume" in argv:  # the round the stopped run had left, from round 1's checkpoint
        assert [r["round"] for r in rounds] == [1, 2], done.stdout
    if step.section == "9":  # the replacement trained as hospital-a, within the budget it was given
        [state] = (walk.dirs["new-hospital-a"] / "home" / "agents").iterdir()
        assert (state / "ledger.sqlite").exists()
        assert trained["hospital-a"]["eps-spent"] <= float(walk.values["LEFT"]) + 1e-9
