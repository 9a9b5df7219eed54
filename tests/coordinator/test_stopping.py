"""The coordinator's processes stop within their grace period even when they ignore SIGTERM, and a
process group stops with every member (the ServerApps the executor started outlive nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from cuvil_edge.coordinator.stopping import stop_processes

#: A process that ignores SIGTERM and starts a child that ignores it too, then prints the child's pid.
STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); print(c.pid, flush=True); "
            "time.sleep(600)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_process_group_that_ignores_sigterm_is_killed_after_the_grace_whole():
    leader = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(leader.stdout.readline())
    began = time.monotonic()
    stop_processes([leader], grace=1.0, group=True)
    took = time.monotonic() - began
    deadline = time.monotonic() + 5  # the orphaned child is reaped by init
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leader.returncode is not None and not _alive(child) and 0.9 < took < 3


def test_processes_that_stop_on_sigterm_are_not_waited_for():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
    began = time.monotonic()
    stop_processes(procs, grace=10.0)
    assert all(p.returncode == -15 for p in procs) and time.monotonic() - began < 2
    assert os.getpgid(0)  # our own group was never signalled


def test_a_process_without_a_group_of_its_own_is_still_stopped():
    """A process started without a session of its own has no group of its id: stopping it "as a
    group" must still stop it, not leave it running (a restarted executor, a caller's mistake)."""
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    child = int(stubborn.stdout.readline())
    began = time.monotonic()
    try:
        stop_processes([stubborn], grace=1.0, group=True)
        assert stubborn.returncode is not None and time.monotonic() - began < 5
    finally:
        os.kill(child, 9)  # its child shares this test's group: not the stop's to take
