"""`cuvil-edge agent run`'s restart policy, with real child processes standing in for the SuperNode's
exits (the real SuperNode's refusal is in tests/e2e/test_deployment.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from cuvil_edge.agent.daemon import REFUSED_EXIT, REFUSED_MARK, REFUSED_RETRY_S, run_forever, run_once


def _child(tmp_path: Path, script: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text(script)
    return [sys.executable, str(path)]


class FakeTime:
    """The daemon's clock and sleep, advanced by its own pauses (no real waiting)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_a_refusal_that_persists_stops_the_agent_with_305(tmp_path):
    t = FakeTime()
    command = _child(tmp_path, f"print('ERROR : {REFUSED_MARK}'); raise SystemExit(1)")
    assert run_forever(command, tmp_path, refused_grace=60, sleep=t.sleep, clock=t.clock) == REFUSED_EXIT
    assert t.pauses == [REFUSED_RETRY_S] * 12  # kept trying for the whole grace period, at a short pace


def test_a_node_refused_for_a_minute_after_a_crash_rejoins(tmp_path):
    """After a SIGKILL the SuperLink refuses the same key for about a minute; the agent must not give up."""
    attempts = tmp_path / "attempts"
    command = _child(tmp_path, f"""
from pathlib import Path
p = Path({str(attempts)!r}); n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1))
if n < 12:
    print('ERROR : {REFUSED_MARK}'); raise SystemExit(1)
if n == 12:
    print('connected'); raise SystemExit(0)   # ran, then the coordinator went away
print('ERROR : {REFUSED_MARK}'); raise SystemExit(1)
""")
    t = FakeTime()
    assert run_forever(command, tmp_path, refused_grace=90, sleep=t.sleep, clock=t.clock) == REFUSED_EXIT
    # 12 refusals (60 s) tolerated, one run, then a fresh grace period for the next refusals
    assert int(attempts.read_text()) == 13 + 18 + 1


def test_an_absent_coordinator_is_retried_with_growing_pauses(tmp_path):
    t = FakeTime()
    command = _child(tmp_path, "raise SystemExit(1)")
    stop = iter(range(6))

    def sleep(seconds):
        t.sleep(seconds)
        if next(stop) == 5:
            raise KeyboardInterrupt

    try:
        run_forever(command, tmp_path, max_backoff=8, sleep=sleep, clock=t.clock)
    except KeyboardInterrupt:
        pass
    assert t.pauses == [2, 4, 8, 8, 8, 8]


def _agent_with_supernode(tmp_path: Path, prelude: str = "") -> tuple[subprocess.Popen, int]:
    """`run_once` in its own process over a stand-in SuperNode that sleeps; (agent, SuperNode pid)."""
    pid_file = tmp_path / "pid"
    child = _child(tmp_path, f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                             "print('up', flush=True); time.sleep(600)")
    agent = subprocess.Popen([sys.executable, "-c", (
        f"import signal, sys; from pathlib import Path; from cuvil_edge.agent.daemon import run_once;{prelude}"
        f"run_once({child!r}, Path({str(tmp_path)!r}))")])
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return agent, int(pid_file.read_text())


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_stopping_the_agent_stops_its_supernode(tmp_path):
    """SIGTERM to `agent run` must not leave the SuperNode running on its own."""
    agent, supernode = _agent_with_supernode(tmp_path, "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0));")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 0
    time.sleep(0.2)
    assert _gone(supernode)


def test_a_killed_agent_takes_its_supernode_with_it(tmp_path):
    """`kill -9` on `agent run` (or the OOM killer) must not leave its SuperNode online on its own:
    it would keep taking the site's tasks, and the restarted agent's would be a second node."""
    agent, supernode = _agent_with_supernode(tmp_path)
    agent.kill()
    agent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while not _gone(supernode):
        assert time.monotonic() < deadline, "the SuperNode outlived its killed agent"
        time.sleep(0.1)


def test_run_once_reports_refusal_from_the_log(tmp_path):
    assert run_once(_child(tmp_path, f"print('{REFUSED_MARK}'); raise SystemExit(1)"), tmp_path) == (1, True)
    assert run_once(_child(tmp_path, "print('fine'); raise SystemExit(3)"), tmp_path) == (3, False)


def test_a_helper_left_behind_neither_blocks_the_agent_nor_outlives_the_supernode(tmp_path):
    """Flower's SuperNode starts `flower-superexec`, which can outlive it holding the output pipe:
    the agent must still see the exit (and retry) and must stop the helper."""
    pid_file = tmp_path / "helper.pid"
    command = _child(tmp_path, f"""
import subprocess, sys
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # inherits stdout
open({str(pid_file)!r}, "w").write(str(helper.pid))
print("{REFUSED_MARK}", flush=True)
raise SystemExit(1)
""")
    started = time.monotonic()
    assert run_once(command, tmp_path) == (1, True)
    assert time.monotonic() - started < 20
    helper = int(pid_file.read_text())
    assert not Path(f"/proc/{helper}").exists() or Path(f"/proc/{helper}/stat").read_text().split()[2] == "Z"
