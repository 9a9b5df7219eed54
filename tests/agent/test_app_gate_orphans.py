"""A ClientApp task whose executor is gone ends itself: it does not retry for ever against a
SuperNode that stopped (a run stopped mid-round, then the device shut down)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from cuvil_edge.agent.app_gate import ORPHAN_GRACE_S

EXECUTOR = Path(__file__).with_name("task_executor.py")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_task_whose_executor_crashed_ends_itself():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: connections are refused, retried
    executor = subprocess.Popen([sys.executable, str(EXECUTOR), address, "die"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)  # the task keeps both: read its pid, not to the end
    task = int(executor.stdout.readline())
    executor.wait(timeout=120)
    executor.stdout.close()
    try:
        assert _alive(task), "the task ended with its executor, before its orphan watch could show anything"
        deadline = time.monotonic() + ORPHAN_GRACE_S + 15
        while time.monotonic() < deadline and _alive(task):
            time.sleep(0.5)
        assert not _alive(task), "the task outlived its executor"
    finally:
        if _alive(task):
            os.kill(task, 9)
