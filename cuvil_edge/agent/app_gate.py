"""A device runs only its own installed ClientApp: the executor of a SuperNode's tasks.

Flower's own executor (``flower-superexec``, started by a SuperNode in its default ``subprocess``
isolation) installs whatever FAB a run names and imports it: any holder of the coordinator's Control
API could run code on every device. So `cuvil-edge agent run` starts the SuperNode with
``--isolation process`` and its Runtime API behind a secret only this executor holds
(``--superexec-auth-secret-file``), and runs this module instead:

* it polls the SuperNode's Runtime API for ClientApp tasks (AcquireTask, signed with the secret)
  and starts one task process per task, as Flower's executor would, but forked from a process that
  has already imported what a task needs (:class:`TaskStarter`);
* each task process takes its task's inputs (message, context, run, FAB), compares the FAB entry
  by entry with the app installed here (config/flower_app.py) *before anything of it is
  imported*, then runs the installed ClientApp (``cuvil_edge.agent.client_app.app``: the FAB is
  never installed nor put on ``sys.path``) and pushes its reply. A foreign run is refused, logged
  on the device, and answered with an error reply of code :data:`APP_REFUSED_CODE`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path

from cuvil_edge.config.round_protocol import Failures

log = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s cuvil-edge app-gate %(levelname)s %(message)s"

#: Error code of the reply to a run whose app is not the one installed here (``app-refused``).
APP_REFUSED_CODE = Failures.APP_REFUSED.code
#: Error code of the reply when the installed ClientApp itself raised (``app-failed``; its type only
#: leaves the device).
APP_FAILED_CODE = Failures.APP_FAILED.code
#: The name a task process goes by (``ps -o comm``, ``top``): each is forked from the task starter
#: and so has its command line.
TASK_PROCESS_NAME = "cuvil-edge-task"
#: What a ClientApp task imports: Flower's Runtime API client, the ClientApp, the compiler it builds
#: packages with, the privacy ledger and, where this installation trains, torch and opacus. The task
#: starter imports them once; in a fresh process a training task spent about 3 s of CPU on them
#: (x86-64, every round; several times that on a small ARM board). Modules this installation lacks
#: (the device profile has no torch) are passed over.
WARM_MODULES = (
    "flwr.supernode.runtime.run_clientapp",
    "flwr.supercore.heartbeat",
    "cuvil_edge.config.flower_app",
    "cuvil_edge.agent.client_app",
    "cuvil_edge.device_targets.build",
    "cuvil_edge.privacy.ledger",
    "cuvil_edge.agent.training",
    "cuvil_edge.agent.torch_model",
    "cuvil_edge.privacy.dpsgd",
    "opacus",
)
#: Seconds a task process outlives the executor that started it before it ends itself.
ORPHAN_GRACE_S = 5.0
#: What the executor sends a task process that a newer task has superseded (see :func:`serve_tasks`).
SUPERSEDED_SIGNAL = signal.SIGUSR1


class _Superseded(BaseException):
    """Raised in a task process once :data:`SUPERSEDED_SIGNAL` came: not an ``Exception``, so the
    ClientApp's own handlers do not turn it into an error reply."""


class _Supersession:
    """Whether this task process was superseded, and where that may interrupt it: only once it has
    taken its message. A task that ended before taking it would be handed out again (Flower starts
    one for a message nobody took), and that one would supersede the newer task in turn; so a
    superseded task still takes its message, then stops, and reports its task finished, so that
    its SuperNode neither hands it out again nor invents a "stopped responding" reply for it."""

    def __init__(self) -> None:
        self.came = self.interruptible = False

    def install(self) -> None:
        signal.signal(SUPERSEDED_SIGNAL, self._on_signal)

    def _on_signal(self, *_) -> None:
        self.came = True
        self._interrupt()

    def taken(self) -> None:
        """The message is taken: stop now if superseded already, else at the signal."""
        self.interruptible = True
        if self.came:
            self._interrupt()

    def _interrupt(self) -> None:
        if self.interruptible:
            self.interruptible = False  # once: a second signal must not interrupt the stopping
            raise _Superseded

    def done(self) -> None:
        """What is left (pushing the outputs) runs whole."""
        self.interruptible = False


_supersession = _Supersession()


def _runtime_client(address: str, interceptors: list):
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,  # the SuperNode's loopback Runtime API
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), *interceptors],
        retry_invoker=make_simple_http_retry_invoker(),
    )


def serve_tasks(address: str, secret_file: Path, parent_pid: int | None = None) -> None:
    """Start a task process for every ClientApp task the SuperNode at ``address`` hands out;
    return when the parent (the SuperNode) is gone.

    A task still running when the next one is handed out is superseded: it is told to stop and
    push no reply. Flower's SuperNode takes one message at a time and waits for its reply before it
    takes the next, so a new task means it took a new message without waiting for the older ones:
    it reconnected (the SuperLink restarted, say, and the older message's run was stopped with it).
    It then sends whichever reply comes first as the reply of its newest message and the next one
    only after another message arrives; a late reply of the stopped run went first, and every reply
    of the new run was one message late (the round timed out waiting for this site, for good)."""
    from flwr.supercore.constant import TaskType

    from cuvil_edge.config.flower_app import acquire_tasks

    starter = TaskStarter(address)
    running: list[BaseProcess] = []

    def launch(task, token: str) -> None:
        running[:] = [p for p in running if p.is_alive()]  # reap finished tasks
        for older in running:
            log.warning("task process %d superseded by a newer task; it stops and sends no reply", older.pid)
            try:
                os.kill(older.pid, SUPERSEDED_SIGNAL)  # type: ignore[arg-type]  # a started process has a pid
            except ProcessLookupError:
                pass
        running.append(starter.start(token))

    acquire_tasks(
        address,
        secret_file,
        TaskType.CLIENT_APP,
        launch,
        root_certificates=None,
        parent_pid=parent_pid,
        component="flwr-clientapp",
    )


class TaskStarter:
    """Starts the task processes of the SuperNode at ``address``, each forked from a process that
    has imported :data:`WARM_MODULES` (the standard library's fork server: a fresh interpreter this
    process starts, which forks each task before it has opened a connection or started a thread).
    A task so pays only for its own work, not for the imports of every round. The fork server
    starts with the first task, so an executor that is never handed one imports nothing more.

    Who can reach it: it takes requests on a Unix socket of mode 0600 in a private temporary folder,
    so only this user's processes; what it is sent (the Runtime API address and the task's token)
    stays among them, as before in a task process's environment. A forked task does not share its
    siblings' random state: Python's ``random`` reseeds at every fork and the task reseeds numpy's
    (DP noise comes from the OS CSPRNG in any case, privacy/samplers.py)."""

    def __init__(self, address: str) -> None:
        import multiprocessing

        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(WARM_MODULES))
        self.address = address

    def start(self, token: str) -> BaseProcess:
        """Start the task ``token`` names; its process (a daemon: it is stopped when this one exits)."""
        executor = os.getpid()
        return self.fork(_task_process, self.address, token, executor, _started_at(executor))

    def fork(self, target, *args) -> BaseProcess:
        """Run ``target(*args)`` (a module-level function) in a process forked from the warm one."""
        process = self._context.Process(target=target, args=args, name=TASK_PROCESS_NAME, daemon=True)
        process.start()
        return process

    def queue(self):
        """A queue a forked process can put its results on."""
        return self._context.Queue()


def _task_process(address: str, token: str, executor: int, executor_started: int | None) -> None:
    """The body of a task process, forked from the task starter; its exit status is run_task's."""
    _as_new_process()
    from flwr.supercore.app_utils import start_parent_process_monitor

    start_parent_process_monitor(executor)
    _exit_when_orphaned(executor, executor_started)
    sys.exit(run_task(address, token))


def _as_new_process() -> None:
    """Make a process forked from the task starter a task process of its own: its handlers, name
    and log, and random state of its own (the starter's global numpy state is every sibling's)."""
    _supersession.install()  # first: a task superseded while it starts still takes its message
    _name_this_process(TASK_PROCESS_NAME)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds run_task's finally: the output is pushed
    import numpy as np

    np.random.seed()  # from the OS, as a new process's is


def _name_this_process(name: str) -> None:
    """Set the name ``ps -o comm`` and ``top`` show (Linux; elsewhere the process keeps its own)."""
    if sys.platform.startswith("linux"):
        import ctypes

        set_name = 15  # PR_SET_NAME, <linux/prctl.h>
        try:
            ctypes.CDLL(None).prctl(set_name, name.encode()[:15], 0, 0, 0)
        except (OSError, AttributeError):
            pass


def run_task(address: str, token: str) -> int:
    """Take one task's inputs, check its app, run the installed ClientApp or refuse; push the reply.

    Returns the exit status: 0 when the ClientApp replied, 1 when the run was refused or failed.
    """
    from flwr.app import Error, Message
    from flwr.common.constant import SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    from cuvil_edge.config.flower_app import ForeignAppError, check_run_app

    client = _runtime_client(address, [RuntimeTokenHttpInterceptor(token)])
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    message = context = reply = None
    status, details = SubStatus.FAILED, "the ClientApp did not finish"
    superseded = False
    try:  # the outer handler also catches a supersession that comes while the inner one runs
        try:
            heartbeat.start()
            message, context, run, fab = pull_task_input(client)
            _supersession.taken()
            try:
                check_run_app(fab.content)
            except ForeignAppError as e:
                log.error(
                    "refused run %s (app %s %s, FAB %s...): %s",
                    run.run_id,
                    run.fab_id[:80],
                    run.fab_version[:40],
                    fab.hash_str[:16],
                    e,
                )
                details = f"refused by the device: {e}"
                reply = Message(Error(code=APP_REFUSED_CODE, reason=details), reply_to=message)
            else:
                from cuvil_edge.agent.client_app import app

                reply = app(message=message, context=context)
                status, details = SubStatus.COMPLETED, ""
        except Exception as e:  # a failure becomes an error reply naming only its type
            log.exception("the ClientApp failed")
            details = f"the ClientApp raised {type(e).__name__}; see the device's log"
            if message is not None:
                reply = Message(Error(code=APP_FAILED_CODE, reason=details), reply_to=message)
        _supersession.done()
    except _Superseded:
        superseded = True
        status, details = SubStatus.STOPPED, "superseded by a newer task"
        log.warning("a newer task superseded this one; its reply is not sent")
    finally:
        _supersession.done()
        if reply is not None and context is not None and not superseded:
            try:
                push_message(client, reply, context)
            except Exception:  # logged; the SuperLink reports the missing reply
                log.exception("pushing the reply failed")
                status = SubStatus.FAILED
        push_task_output(client=client, context=context, sub_status=status, details=details)
        if heartbeat.is_running:
            heartbeat.stop()
        client.close()
    return 0 if status == SubStatus.COMPLETED else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cuvil-edge's ClientApp executor (started by `agent run`)")
    parser.add_argument("mode", choices=("serve",))
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's loopback Runtime API")
    parser.add_argument("--secret-file", type=Path, required=True, help="the Runtime API secret")
    parser.add_argument("--parent-pid", type=int, help="stop when this process is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # exits cleanly: its task processes are stopped
    serve_tasks(args.runtime_api_address, args.secret_file, args.parent_pid)
    return 0


def _started_at(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot; Linux), so that a later process given
    the same pid is not taken for it; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _exit_when_orphaned(executor: int, started: int | None, grace_s: float = ORPHAN_GRACE_S) -> None:
    """End this process once ``executor`` (the process that started it, under the SuperNode; it
    started at ``started``, see :func:`_started_at`) is gone.

    Flower's monitor raises SIGINT in its own thread, which a main thread inside Flower's
    connection retries never sees: a task of a stopped run whose SuperNode then stopped kept
    retrying for ever (seen after `flwr stop` mid-round). Nothing it computes could be delivered
    any more, so after ``grace_s`` (Flower's stop first) it exits."""
    import threading
    import time

    def orphaned() -> bool:
        try:
            os.kill(executor, 0)
        except (ProcessLookupError, PermissionError):  # gone, or its pid is another user's now
            return True
        return started is not None and _started_at(executor) != started

    def watch() -> None:
        while not orphaned():
            time.sleep(0.5)
        time.sleep(grace_s)
        log.warning("the executor (pid %d) is gone; this task stops", executor)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="orphan-watch").start()


if __name__ == "__main__":
    # run as the module's own name, so that the task processes run the functions the task starter imported
    from cuvil_edge.agent.app_gate import main as _main

    sys.exit(_main())
