"""Task processes start warm: forked from the executor's task starter, which imported what a task
needs once, yet each is a process of its own (its name, its random state)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from cuvil_edge.agent.app_gate import TASK_PROCESS_NAME

EXECUTOR = Path(__file__).with_name("task_executor.py")


def _closed_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again: connections are refused, retried


def test_a_task_starts_with_torch_and_opacus_already_loaded_and_goes_by_its_own_name():
    executor = subprocess.Popen([sys.executable, str(EXECUTOR), _closed_address(), "wait"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    task = None
    try:
        task = int(executor.stdout.readline())
        deadline = time.monotonic() + 120
        while b"Connection attempt failed" not in (line := executor.stderr.readline()):  # it is taking its input
            assert line and time.monotonic() < deadline, "the task never tried to take its input"
        # it has run no ClientApp code yet: what is mapped came with the fork
        maps = Path(f"/proc/{task}/maps").read_text()
        assert "libtorch_cpu" in maps and "/opacus/" not in maps  # opacus is pure Python: see its modules below
        assert Path(f"/proc/{task}/comm").read_text().strip() == TASK_PROCESS_NAME
        parent = int(Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent != executor.pid  # forked from the starter, not started by the executor itself
    finally:
        executor.kill()
        executor.wait(timeout=30)
        if task is not None:
            try:
                os.kill(task, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_forked_tasks_do_not_share_their_random_state():
    out = subprocess.run([sys.executable, str(EXECUTOR), "draws"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    for source in ("numpy", "random", "noise"):
        assert first[source] != second[source], source
