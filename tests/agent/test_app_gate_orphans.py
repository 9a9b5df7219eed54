"""A ClientApp task whose executor is gone ends itself: it does not retry for ever against a
SuperNode that stopped (a run stopped mid-round, then the device shut down)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from cuvil_edge.agent.app_gate import ORPHAN_GRACE_S, TOKEN_ENV

# the executor: starts one task against a Runtime API nobody serves, says its pid, and exits
EXECUTOR = """
import os, subprocess, sys, time
task = subprocess.Popen([sys.executable, "-m", "cuvil_edge.agent.app_gate", "task", "--runtime-api-address",
                         sys.argv[1], "--parent-pid", str(os.getpid())],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(task.pid, flush=True)
time.sleep(2)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_task_whose_executor_exits_ends_itself():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: connections are refused, retried
    env = dict(os.environ, **{TOKEN_ENV: "ab" * 32})
    executor = subprocess.run([sys.executable, "-c", EXECUTOR, address], env=env, capture_output=True, text=True,
                              timeout=60)
    task = int(executor.stdout.split()[0])
    try:
        deadline = time.monotonic() + ORPHAN_GRACE_S + 15
        while time.monotonic() < deadline and _alive(task):
            time.sleep(0.5)
        assert not _alive(task), "the task outlived its executor"
    finally:
        if _alive(task):
            os.kill(task, 9)
