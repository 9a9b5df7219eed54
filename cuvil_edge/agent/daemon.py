"""`cuvil-edge agent run`: the site's SuperNode, restarted with back-off while the coordinator is away.

The SuperNode authenticates with the site's node key, trusts only the pinned CA, and carries the
site's own settings in its node config (its site file and home): the ClientApp reads everything
from there, nothing from the coordinator. The SuperNode runs in ``process`` isolation with its
Runtime API behind a secret in the state directory, and the only executor of its tasks is
agent/app_gate.py, which runs the installed ClientApp and refuses any run whose app is not it.
Its identity, ledger and anti-rollback state live in the state directory, so a restart continues
where it stopped.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cuvil_edge.agent.enroll import CA_FILE, NODE_KEY
from cuvil_edge.config.flower_env import flower_tool, flwr_env
from cuvil_edge.config.home import site_state_dir
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.errors import ConfigError

log = logging.getLogger(__name__)

#: What flower-supernode 1.42 logs when the SuperLink refuses its key (Flower's exit code 305; the
#: process itself exits with status 1, so the log line is what tells a refusal from an outage).
REFUSED_MARK = "Exit Code: 305"
#: `agent run`'s exit status once it gives up on a refused key: sysexits' EX_CONFIG (an exit status is
#: 0..255, so Flower's 305 would reach systemd as 49).
REFUSED_EXIT = 78
#: The SuperNode's Runtime API secret (Flower's ``--superexec-auth-secret-file``), in the state's keys/.
RUNTIME_SECRET = "runtime.secret"


def runtime_secret(state: Path) -> Path:
    """``<state>/keys/runtime.secret`` (0600), made on first use.

    Raises:
        UnsafePathError: it exists but is not private to this user.
    """
    from cuvil_edge.private_dir import load_or_create_key

    path = Path(state) / "keys" / RUNTIME_SECRET
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    load_or_create_key(path, what="the SuperNode's Runtime API secret")
    return path


def gate_command(site: SiteConfig, home: Path, port: int, supernode_pid: int) -> list[str]:
    """The executor of the SuperNode's ClientApp tasks (agent/app_gate.py); it stops with the SuperNode."""
    return [
        sys.executable,
        "-m",
        "cuvil_edge.agent.app_gate",
        "serve",
        "--runtime-api-address",
        f"127.0.0.1:{port}",
        "--secret-file",
        str(runtime_secret(site_state_dir(site, home))),
        "--parent-pid",
        str(supernode_pid),
    ]


def supernode_command(
    site: SiteConfig, site_file: Path, home: Path, superlink: str, port: int, partition: tuple[int, int] = (0, 1)
) -> list[str]:
    """``flower-supernode`` for ``site``: TLS to the pinned CA, node authentication, own node config.

    Raises:
        ConfigError: the device was not set up (`cuvil-edge agent init`).
    """
    state = site_state_dir(site, home)
    key, ca = state / "keys" / NODE_KEY, state / CA_FILE
    for path in (key, ca):
        if not path.exists():
            raise ConfigError(f"{path} is missing; set the device up with `cuvil-edge agent init --site ... --ca ...`")
    node_config = (
        f"site-config='{Path(site_file).resolve()}' home='{Path(home).resolve()}' "
        f"partition-id={partition[0]} num-partitions={partition[1]}"
    )
    return [
        flower_tool("flower-supernode"),
        "--root-certificates",
        str(ca),
        "--superlink",
        superlink,
        "--auth-supernode-private-key",
        str(key),
        "--node-config",
        node_config,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--isolation",
        "process",
        "--superexec-auth-secret-file",
        str(runtime_secret(state)),
    ]


#: Makes the executor's command for a SuperNode's pid (:func:`gate_command` with the site bound).
GateCommand = Callable[[int], list[str]]


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the agent dies (Linux's
    PR_SET_PDEATHSIG), or None elsewhere. The SuperNode runs in a session of its own, so a
    killed agent (``kill -9``, the OOM killer) would otherwise leave it online: it would keep
    taking the site's tasks unsupervised, and the restarted agent's SuperNode would be a second
    node with the same key. The function is looked up before the fork, so the child only calls it.
    The kernel ties the signal to the *thread* that forks, so the SuperNode is started from the
    thread that waits for it (``run_once``'s, ``local_federation``'s caller's), never a short-lived one.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    set_pdeathsig = 1  # PR_SET_PDEATHSIG, <linux/prctl.h>
    return lambda: prctl(set_pdeathsig, signal.SIGKILL)


def start_agent(
    command: list[str], home: Path, gate: GateCommand | None, **popen
) -> tuple[subprocess.Popen, subprocess.Popen | None]:
    """Start the SuperNode and its ClientApp executor, each in a new session (its process group
    holds its helpers) and each killed by the kernel if this process dies; (SuperNode, executor or
    None). The executor also stops by itself once the SuperNode is gone."""
    guard = _die_with_parent()
    node = subprocess.Popen(command, env=flwr_env(home), start_new_session=True, preexec_fn=guard, **popen)
    executor = None
    if gate is not None:
        executor = subprocess.Popen(
            gate(node.pid), env=flwr_env(home), start_new_session=True, preexec_fn=guard, **popen
        )
    return node, executor


def run_once(command: list[str], home: Path, gate: GateCommand | None = None) -> tuple[int, bool]:
    """Run the SuperNode once, passing its output through; (exit status, whether it was refused).

    The SuperNode and its executor (agent/app_gate.py, with the ClientApps it starts) run in
    process groups of their own; when the SuperNode exits, both groups are stopped, since a helper
    left behind would keep running and hold the output pipe open. If this process is told to
    stop (SIGTERM -> SystemExit, Ctrl-C), the group gets SIGTERM first, so the SuperNode closes
    its session and an immediate restart is accepted.
    """
    import threading

    refused = threading.Event()
    proc, executor = start_agent(
        command, home, gate, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )

    def relay(source: subprocess.Popen) -> None:
        for line in source.stdout:  # type: ignore[union-attr]  # stdout=PIPE
            sys.stdout.write(line)
            if REFUSED_MARK in line:
                refused.set()

    readers = [threading.Thread(target=relay, args=(p,), daemon=True) for p in (proc, executor) if p is not None]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait()
    finally:
        _stop_group(proc)
        if executor is not None:
            _stop_group(executor)
        for reader in readers:
            reader.join(timeout=10)
        for p in (proc, executor):
            if p is not None:
                p.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE
    return code, refused.is_set()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the SuperNode's process group, then SIGKILL what is left after 30 s."""
    import os
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)  # helpers watching the SuperNode exit on their own; the rest get SIGKILL
    proc.wait()


#: How long `agent run` keeps retrying while the SuperLink refuses the node. After a crash or power
#: loss the SuperLink refuses the node's key until it has marked the old session offline (55-65 s
#: measured with Flower 1.42 on 127.0.0.1), and that refusal looks exactly like an unregistered
#: key's (same exit code, same log), so only its persistence tells them apart.
REFUSED_GRACE_S = 180.0
#: Pause between attempts while refused (short: the node should rejoin soon after the minute).
REFUSED_RETRY_S = 5.0


def run_forever(
    command: list[str],
    home: Path,
    gate: GateCommand | None = None,
    *,
    max_backoff: float = 60.0,
    refused_grace: float = REFUSED_GRACE_S,
    sleep=time.sleep,
    clock=time.monotonic,
) -> int:
    """Run the SuperNode; when it exits (coordinator away, network lost), restart it after a
    growing pause. Returns :data:`REFUSED_EXIT` once the SuperLink has refused the node's key for
    ``refused_grace`` seconds in a row (an unenrolled key; systemd units do not restart on it).
    """
    backoff = 1.0
    refused_since: float | None = None
    while True:
        started = clock()
        code, refused = run_once(command, home, gate)
        if refused:
            refused_since = started if refused_since is None else refused_since
            if clock() - refused_since >= refused_grace:
                log.error(
                    "the SuperLink has refused this node's key for %.0f s; enroll it (`cuvil-edge coordinator enroll`)",
                    clock() - refused_since,
                )
                return REFUSED_EXIT
            log.warning(
                "the SuperLink refused this node: its key is not registered, or its previous session "
                "is still open (after a crash it is closed within about a minute); retrying in %.0f s",
                REFUSED_RETRY_S,
            )
            sleep(REFUSED_RETRY_S)
            continue
        refused_since = None
        backoff = 1.0 if clock() - started > 300 else min(max_backoff, backoff * 2)
        log.warning("the SuperNode exited with %s; restarting in %.0f s", code, backoff)
        sleep(backoff)
