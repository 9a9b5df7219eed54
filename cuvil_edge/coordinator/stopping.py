"""Stopping the coordinator's processes by PID (or process group), quickly and for certain."""

from __future__ import annotations

import subprocess
import time

#: Seconds each of the coordinator's processes gets to stop before it is killed: `serve` stops
#: within about twice this.
STOP_GRACE = 3.0


def stop_processes(procs: list[subprocess.Popen], grace: float, group: bool = False, term: bool = True) -> None:
    """SIGTERM ``procs`` (with ``group``, each one's whole process group), SIGKILL after ``grace`` s;
    without ``term``, SIGKILL at once (as a crash would)."""
    import os
    import signal

    def send(proc: subprocess.Popen, sig: int) -> None:
        if group:
            try:
                os.killpg(proc.pid, sig)  # the leader may be gone while its ServerApps live on
                return
            except (ProcessLookupError, PermissionError):
                pass  # no group of that id: a process started without a session of its own
        try:
            if proc.poll() is None:
                proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    for proc in procs:
        send(proc, signal.SIGTERM if term else signal.SIGKILL)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        if group:
            _wait_group(proc.pid, deadline)
        send(proc, signal.SIGKILL)
        proc.wait(timeout=30)


def _wait_group(pgid: int, deadline: float) -> None:
    """Until no process of group ``pgid`` is left, or ``deadline``."""
    import os

    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
