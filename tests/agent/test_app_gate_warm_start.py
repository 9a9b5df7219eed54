"""Task processes start warm: forked from the executor's task starter, which imported what a task
needs once, yet each is a process of its own (its name, its random state)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from cuvil_edge.agent.app_gate import TASK_PROCESS_NAME
from task_executor import waiting_task

EXECUTOR = Path(__file__).with_name("task_executor.py")


def test_a_task_starts_with_torch_already_loaded_and_goes_by_its_own_name():
    with waiting_task() as (executor, task):
        # it has run no ClientApp code yet: what is mapped came with the fork
        maps = Path(f"/proc/{task}/maps").read_text()
        assert "libtorch_cpu" in maps
        assert Path(f"/proc/{task}/comm").read_text().strip() == TASK_PROCESS_NAME
        parent = int(Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent != executor.pid  # forked from the starter, not started by the executor itself


def test_forked_tasks_do_not_share_their_random_state():
    out = subprocess.run([sys.executable, str(EXECUTOR), "draws"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    for source in ("numpy", "random", "noise"):
        assert first[source] != second[source], source


def test_only_this_user_can_reach_the_task_starter():
    """The fork server takes a task's token: its socket must not be open to other users."""
    with waiting_task() as (_, task):
        starter = int(Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()[1])
        inodes = {os.readlink(f"/proc/{starter}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{starter}/fd")
                  if os.readlink(f"/proc/{starter}/fd/{fd}").startswith("socket:[")}
        paths = [line.split()[7] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                 if len(line.split()) > 7 and line.split()[6] in inodes]
        assert paths, "the task starter listens on no named socket"
        for path in paths:
            assert not path.startswith("@"), f"{path}: an abstract socket, which any local process can reach"
            assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path
            folder = os.stat(os.path.dirname(path))
            assert folder.st_uid == os.getuid() and stat.S_IMODE(folder.st_mode) & 0o077 == 0, path
