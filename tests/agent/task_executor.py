"""An executor of task processes for the tests, started as a script: it starts one task through
:class:`cuvil_edge.agent.app_gate.TaskStarter`, as `agent run`'s executor does, against a Runtime
API nobody serves (so the task keeps trying to take its message), and prints the task's pid.

    python tests/agent/task_executor.py ADDRESS die    exits at once, cleaning up nothing (a crash)
    python tests/agent/task_executor.py ADDRESS wait   stays until it is killed
    python tests/agent/task_executor.py draws          forks two processes as tasks and prints what
                                                       each drew from its random sources (JSON)

The tests use it through :func:`closed_address`, :func:`waiting_task` and :func:`alive`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cuvil_edge.agent import app_gate


def closed_address() -> str:
    """A loopback address nothing listens on: connections are refused, and retried."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@contextmanager
def waiting_task() -> Iterator[tuple[subprocess.Popen, int]]:
    """(the executor, its task's pid), once the task has tried to take its input (so it has set
    itself up as a task); both are killed on leaving."""
    executor = subprocess.Popen([sys.executable, __file__, closed_address(), "wait"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    task = None
    try:
        task = int(executor.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 120
        while b"Connection attempt failed" not in (line := executor.stderr.readline()):  # type: ignore[union-attr]
            assert line and time.monotonic() < deadline, "the task never tried to take its input"
        yield executor, task
    finally:
        executor.kill()
        executor.wait(timeout=30)
        if task is not None and alive(task):
            os.kill(task, signal.SIGKILL)


def draws(queue) -> None:
    """In a forked process set up as a task: a draw from each source of randomness a task has."""
    import random

    import numpy as np

    from cuvil_edge.privacy.samplers import discrete_laplace

    app_gate._as_new_process()
    queue.put({"numpy": np.random.random(4).tolist(), "random": random.random(),
               "noise": discrete_laplace(3, 8).tolist()})


def main(argv: list[str]) -> None:
    if argv[0] == "draws":
        starter = app_gate.TaskStarter("127.0.0.1:1")
        queue = starter.queue()
        tasks = [starter.fork(draws, queue) for _ in range(2)]
        print(json.dumps([queue.get(timeout=120) for _ in tasks]), flush=True)
        return
    address, mode = argv
    task = app_gate.TaskStarter(address).start("ab" * 32)
    print(task.pid, flush=True)
    if mode == "die":
        time.sleep(1)
        os._exit(0)  # no clean-up: its daemonic task is not stopped by it
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1:])
