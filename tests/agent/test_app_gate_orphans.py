"""A ClientApp task whose executor is gone ends itself: it does not retry for ever against a
SuperNode that stopped (a run stopped mid-round, then the device shut down)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cuvil_edge.agent.app_gate import ORPHAN_GRACE_S
from task_executor import alive, closed_address

EXECUTOR = Path(__file__).with_name("task_executor.py")


def test_a_task_whose_executor_crashed_ends_itself():
    executor = subprocess.Popen([sys.executable, str(EXECUTOR), closed_address(), "die"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)  # the task keeps both: read its pid, not to the end
    task = int(executor.stdout.readline())
    executor.wait(timeout=120)
    executor.stdout.close()
    try:
        assert alive(task), "the task ended with its executor, before its orphan watch could show anything"
        deadline = time.monotonic() + ORPHAN_GRACE_S + 15
        while time.monotonic() < deadline and alive(task):
            time.sleep(0.5)
        assert not alive(task), "the task outlived its executor"
    finally:
        if alive(task):
            os.kill(task, 9)
