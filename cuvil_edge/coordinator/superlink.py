"""The coordinator on Flower's deployment engine: SuperLink, node registration, run submission.

Everything lives in the coordinator home: TLS material (``tls/``), the SuperLink's database
(``superlink.db``, so registrations survive restarts) and the ``flwr`` CLI's configuration
(``flwr/config.toml``, connection ``cuvil``).
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cuvil_edge.config.flower_env import flower_tool, flwr_env
from cuvil_edge.coordinator import control_api
from cuvil_edge.coordinator.registry import SiteRegistry
from cuvil_edge.coordinator.stopping import STOP_GRACE, stop_processes
from cuvil_edge.coordinator.tls import covers_loopback, tls_files
from cuvil_edge.errors import ConfigError, CuvilError, DeploymentError

log = logging.getLogger(__name__)

CONNECTION = "cuvil"
#: Where devices connect: the Fleet gateway (coordinator/fleet_gateway.py), the only listener that
#: may face the network.
DEFAULT_ADDRESS = "127.0.0.1:9093"
#: Where the SuperLink itself listens, with its Control and Runtime APIs: loopback only. The
#: operator's `flwr` CLI (`cuvil-edge run`, `status`) and the ServerApp executor use it.
DEFAULT_OPERATOR_ADDRESS = "127.0.0.1:9092"
#: The Runtime API's shared secret (Flower's `--superexec-auth-secret-file`): only the executor
#: `serve` starts (coordinator/serverapp_gate.py) can take ServerApp tasks, not any process that
#: reaches the loopback port.
SECRET_FILE = "superexec.secret"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_connection(home: Path, address: str) -> Path:
    """``<home>/flwr/config.toml``: the ``cuvil`` connection to the SuperLink's loopback
    (operator) address, pinned to our CA."""
    ca = tls_files(Path(home) / "tls").ca_cert.resolve()
    path = Path(home) / "flwr" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "{address}"\nroot-certificates = "{ca}"\n',
        encoding="utf-8",
    )
    return path


def _split(address: str, what: str) -> tuple[str, int]:
    """Raises: ConfigError: not HOST:PORT."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {address!r} must be HOST:PORT, e.g. 127.0.0.1:9093")
    return host.strip("[]"), int(port)


def _loopback(address: str) -> tuple[str, int]:
    """Raises: ConfigError: ``address`` is not on the loopback interface."""
    import ipaddress

    host, port = _split(address, "--operator-address")
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host, port
    except ValueError:
        pass
    raise ConfigError(
        f"--operator-address {address!r} must be a loopback address (127.0.0.1:PORT): the "
        "SuperLink's Control and Runtime APIs authenticate nobody, so they never face the "
        "network; reach them from another host through SSH (docs/DEPLOYMENT.md §4)"
    )


def secret_file(home: Path) -> Path:
    """``<home>/superexec.secret`` (0600), made on first use: the Runtime API's shared secret.

    Raises:
        UnsafePathError: it exists but is not private to this user.
    """
    from cuvil_edge.private_dir import load_or_create_key

    path = Path(home) / SECRET_FILE
    load_or_create_key(path, what="the SuperLink's Runtime API secret")
    return path


def _tls(home: Path):
    """Raises: ConfigError: the home has no TLS material (`cuvil-edge coordinator certs`)."""
    tls = tls_files(Path(home) / "tls")
    if not tls.server_cert.exists():
        raise ConfigError(f"{tls.server_cert} is missing; run `cuvil-edge coordinator certs --host HOST` first")
    if not covers_loopback(tls.server_cert):
        raise ConfigError(
            f"{tls.server_cert} is not valid for 127.0.0.1, where the SuperLink now listens behind "
            "the Fleet gateway; issue it again: `cuvil-edge coordinator certs --force --host ...` "
            "(same CA: devices need nothing)"
        )
    return tls


def superlink_command(home: Path, operator_address: str = DEFAULT_OPERATOR_ADDRESS) -> list[str]:
    """``flower-superlink`` on a loopback address with TLS, node authentication, the home's
    database and process isolation (ServerApps run only under the executor `serve` starts).

    Raises:
        ConfigError: no TLS material, or ``operator_address`` is not loopback.
    """
    tls = _tls(home)
    host, port = _loopback(operator_address)
    return [
        flower_tool("flower-superlink"),
        "--ssl-certfile",
        str(tls.server_cert),
        "--ssl-keyfile",
        str(tls.server_key),
        "--ssl-ca-certfile",
        str(tls.ca_cert),
        "--enable-supernode-auth",
        "--database",
        str(Path(home) / "superlink.db"),
        "--host",
        host,
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
        "--isolation",
        "process",
        "--superexec-auth-secret-file",
        str(secret_file(home)),
    ]


def superexec_command(home: Path, operator_address: str = DEFAULT_OPERATOR_ADDRESS) -> list[str]:
    """The ServerApp executor (coordinator/serverapp_gate.py), holding the Runtime API secret: it
    runs only the installed app's ServerApp, and stops when ``serve`` does."""
    import os
    import sys

    return [
        sys.executable,
        "-m",
        "cuvil_edge.coordinator.serverapp_gate",
        "--runtime-api-address",
        operator_address,
        "--root-certificates",
        str(_tls(home).ca_cert.resolve()),
        "--secret-file",
        str(secret_file(home)),
        "--parent-pid",
        str(os.getpid()),
    ]


def gateway_command(home: Path, address: str, operator_address: str = DEFAULT_OPERATOR_ADDRESS) -> list[str]:
    """The device-facing Fleet gateway on ``address``, forwarding to the SuperLink's loopback port.

    Raises:
        ConfigError: ``address`` is malformed or is the operator address itself.
    """
    import sys

    tls = _tls(home)
    if _split(address, "--address") == _loopback(operator_address):
        raise ConfigError(f"--address {address} is the SuperLink's own loopback port; give devices another port")
    return [
        sys.executable,
        "-m",
        "cuvil_edge.coordinator.fleet_gateway",
        "--listen",
        address,
        "--upstream",
        operator_address,
        "--certfile",
        str(tls.server_cert),
        "--keyfile",
        str(tls.server_key),
        "--cafile",
        str(tls.ca_cert),
    ]


def wait_healthy(url: str, context: ssl.SSLContext | None = None, timeout: float = 60.0) -> None:
    """Poll a SuperLink's ``/health`` (``url`` up to the path) until it answers 200.

    Raises:
        DeploymentError: no healthy answer within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", context=context, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise DeploymentError(f"the SuperLink at {url} did not become healthy within {timeout:.0f} s")


def _ca_context(home: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls_files(Path(home) / "tls").ca_cert))


def superlink_up(home: Path) -> bool:
    """Whether the SuperLink this home last started (``flwr/config.toml``) answers its health check."""
    import tomllib

    try:
        config = tomllib.loads((Path(home) / "flwr" / "config.toml").read_text(encoding="utf-8"))
        address = config["superlink"][CONNECTION]["address"]
        wait_healthy(f"https://{address}", _ca_context(home), timeout=3)
    except (OSError, ValueError, KeyError, DeploymentError, ssl.SSLError):
        return False
    return True


@dataclass
class Coordinator:
    """The processes `coordinator serve` supervises: the loopback SuperLink, the ServerApp
    executor and the device-facing Fleet gateway. Stopping it stops all three, by PID."""

    address: str
    operator_address: str
    superlink: subprocess.Popen
    superexec: subprocess.Popen
    gateway: subprocess.Popen
    #: enrolled sites the SuperLink did not register at start-up, and why (they cannot join yet)
    unregistered: dict[str, str] = field(default_factory=dict)

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [self.gateway, self.superexec, self.superlink]

    def poll(self) -> int | None:
        """None while all three run; else the exit status of the first that stopped."""
        for proc in self.processes:
            if proc.poll() is not None:
                return proc.returncode
        return None

    def wait(self, timeout: float | None = None) -> int | None:
        """Until one of the three stops (then the others are stopped too); its exit status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and timeout is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("cuvil-edge coordinator", timeout)
            time.sleep(0.5)
        self.terminate()
        return code

    def terminate(self, grace: float = STOP_GRACE) -> None:
        """Stop the executor first, with every ServerApp it started (its process group: SIGTERM lets
        a ServerApp tell the SuperLink its run stopped), then the gateway and the SuperLink; SIGKILL
        whatever is left of each after ``grace`` seconds. Their own graceful stops wait for open
        streams (the SuperLink's took 48 s with a run streaming), so mid-round this takes about
        twice ``grace``. The SuperLink's database is SQLite, which a kill leaves consistent."""
        stop_processes([self.superexec], grace, group=True)
        stop_processes([self.gateway, self.superlink], grace)

    def kill(self) -> None:
        """SIGKILL all three, and the ServerApps the executor started (as a crash of the host would)."""
        stop_processes([self.superexec], 0, group=True, term=False)
        stop_processes([self.gateway, self.superlink], 0, term=False)


def start_superlink(
    home: Path,
    address: str = DEFAULT_ADDRESS,
    log_file: Path | None = None,
    *,
    operator_address: str = DEFAULT_OPERATOR_ADDRESS,
) -> Coordinator:
    """Start the SuperLink on ``operator_address`` (loopback), its ServerApp executor and the Fleet
    gateway on ``address``; wait until both answer, write the CLI connection and register every
    enrolled site. The caller stops the returned :class:`Coordinator`.

    Raises:
        ConfigError / DeploymentError: missing TLS material, a bad address, or it did not start.
    """
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    env = flwr_env(home)
    commands = (superlink_command(home, operator_address), gateway_command(home, address, operator_address))
    link = subprocess.Popen(commands[0], env=env, stdout=out, stderr=subprocess.STDOUT)
    started: list[subprocess.Popen] = [link]
    try:
        wait_healthy(f"https://{operator_address}", _ca_context(home))
        # its own process group, so that stopping it stops the ServerApps it started too
        started.append(
            subprocess.Popen(
                superexec_command(home, operator_address),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        started.append(subprocess.Popen(commands[1], env=env, stdout=out, stderr=subprocess.STDOUT))
        wait_healthy(f"https://{address}", _ca_context(home))
        write_connection(home, operator_address)
        _, failed = register_enrolled(home)
    except BaseException:
        stop_processes(started[1:2], STOP_GRACE, group=True)
        stop_processes(started[:1] + started[2:], STOP_GRACE)
        raise
    return Coordinator(address, operator_address, link, started[1], started[2], failed)


def flwr_cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [flower_tool("flwr"), *args], env=flwr_env(home), capture_output=True, text=True, timeout=timeout
    )


def register_enrolled(home: Path, pending: dict[str, dict] | None = None) -> tuple[dict[str, dict], dict[str, str]]:
    """Register each enrolled site's node key with the SuperLink under the site's name, once, each
    site on its own: a site that fails is logged with its reason and the others go on. The new key
    is registered first, then a replaced device's registrations are withdrawn (its key must stop
    working; a withdrawal that fails stays queued for the next `serve`). The node id the SuperLink
    assigns is kept in the registry (its database keeps the registration across restarts, and
    `flwr supernode list` does not show names to match on).

    ``pending`` (site -> an entry not yet in the registry: `coordinator enroll` registers before it
    writes) registers just those and writes nothing; the caller records what came back.

    Returns:
        (site -> its entry as registered now, with its node id; site -> why it failed). A site whose
        key was registered but whose replaced device could not be withdrawn is in both.

    Raises:
        StateError: the registry cannot be read or written.
    """
    registry = SiteRegistry(home)
    todo = (
        pending
        if pending is not None
        else {
            site: entry
            for site, entry in registry.sites().items()
            if not entry.get("node_id") or entry.get("unregister")
        }
    )
    added: dict[str, dict] = {}
    failed: dict[str, str] = {}

    for site, entry in todo.items():
        done = {**entry, "unregister": list(entry.get("unregister", []))}
        try:
            if not done.get("node_id"):
                key = Path(home) / "flwr" / f"{site}.pub"
                key.write_text(registry.node_key(site, entry) + "\n", encoding="ascii")  # checks the site id too
                done["node_id"] = control_api.register_node(home, CONNECTION, key.read_bytes(), site)
            for old in list(done["unregister"]):  # the replaced device's key must stop working
                control_api.unregister_node(home, CONNECTION, old)
                done["unregister"].remove(old)
        except (CuvilError, OSError) as e:
            failed[site] = str(e)
            log.warning("registering site %r with the SuperLink failed: %s", site, e)
        changed = (done.get("node_id"), done["unregister"]) != (entry.get("node_id"), entry.get("unregister", []))
        if done.get("node_id") and changed:
            if pending is None:
                registry.set_node_id(site, done["node_id"], unregister=done["unregister"])
            added[site] = {k: v for k, v in done.items() if k != "unregister" or v}
            log.info("registered site %r with the SuperLink as node %s", site, done["node_id"])
    return added, failed


def no_superlink(home: Path) -> DeploymentError:
    """The error for a home where `coordinator serve` never ran (no ``flwr/config.toml``)."""
    return DeploymentError(
        f"no SuperLink is configured in {home}; start one there with "
        "`cuvil-edge coordinator serve`, or give the coordinator home with --home"
    )


def submit_run(
    home: Path,
    app_dir: Path,
    federation: Path,
    rounds: int | None = None,
    timeout: float = 3600,
    resume: bool = False,
    verbose: bool = True,
) -> str:
    """`flwr run` the Flower App in ``app_dir`` (it names the ServerApp and ClientApp; it is kept
    above both sides, `cli/flwr_app`) for the federation on the SuperLink and stream it (Flower's
    own log lines only if ``verbose``); returns the run's final status.

    Raises:
        DeploymentError: no SuperLink is configured in ``home`` or it does not answer (nothing is
            submitted then).
        RunEndedError: the run did not finish as completed (its reason: the ServerApp's error).
    """
    if not (Path(home) / "flwr" / "config.toml").exists():  # else flwr would start a local simulation
        raise no_superlink(home)
    config = (
        f"federation='{Path(federation).resolve()}' home='{Path(home).resolve()}' rounds={rounds or 0} "
        f"resume={'true' if resume else 'false'}"
    )
    return flwr_run(home, app_dir, CONNECTION, config, timeout=timeout, verbose=verbose)


class RunEndedError(DeploymentError):
    """A submitted run did not finish as completed; ``reason`` is the ServerApp's own error where it
    raised one (a config or state error, "no site trained in any round: ...")."""

    def __init__(self, message: str, status: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


def flwr_run(
    home: Path,
    app_dir: Path,
    connection: str,
    run_config: str,
    *,
    federation_config: str | None = None,
    timeout: float = 3600,
    verbose: bool = True,
) -> str:
    """``flwr run APP CONNECTION --stream`` with the CLI configuration of ``home``; the final status.
    Unless ``verbose``, the stream shows cuvil-edge's report and Flower's warnings and errors only
    (coordinator/flwr_stream.py).

    Raises:
        RunEndedError: the run did not finish as completed (`flwr run` exits 0 even when the
            ServerApp fails, so the status, and the ServerApp's error, are read back with `flwr ls`).
    """
    from cuvil_edge.coordinator.flwr_stream import failure_reason, relay

    command = [flower_tool("flwr"), "run", str(app_dir), connection, "--stream", "--run-config", run_config]
    if federation_config:
        command += ["--federation-config", federation_config]
    earlier = {r.get("run-id") for r in _runs(home, connection)}  # this run is the one not listed before
    try:
        proc, hidden = relay(command, flwr_env(home), timeout, verbose)
    except KeyboardInterrupt:  # Ctrl-C ends `flwr run`, not the run: stop it on the SuperLink too
        _stop_new_runs(home, connection, earlier)
        raise
    ours = sorted(
        (r for r in _runs(home, connection) if r.get("run-id") not in earlier),
        key=lambda r: str(r.get("pending-at") or ""),
    )
    status = str(ours[-1].get("status", "unknown")) if ours else "no run"
    if proc.returncode == 0 and status == "finished:completed":
        return status
    reason = failure_reason(ours[-1]) if ours else ""
    if not reason:  # nothing from the ServerApp: what `flwr run` said last
        said = [line.strip() for line in hidden if line.strip()]
        reason = f"flwr run exit {proc.returncode}" + (f": {' '.join(said[-3:])[-300:]}" if said else "")
    raise RunEndedError(f"the run ended as {status!r}: {reason}", status, reason)


def _stop_new_runs(home: Path, connection: str, earlier: set) -> None:
    """Stop the runs submitted since ``earlier`` was listed that have not ended; say so on stderr.
    Best effort: the user is leaving, so a failure is reported, not raised."""
    import sys

    try:
        for run in _runs(home, connection):
            if run.get("run-id") not in earlier and not str(run.get("status", "")).startswith("finished"):
                control_api.stop_run(home, connection, str(run.get("run-id")))
                print(f"stopped run {run.get('run-id')} on the SuperLink", file=sys.stderr)
    except (DeploymentError, OSError) as e:
        print(f"could not stop the run on the SuperLink ({e}); `cuvil-edge runs` and `stop` can", file=sys.stderr)


def _runs(home: Path, connection: str) -> list[dict]:
    """The SuperLink's runs (what `flwr ls` lists).

    Raises:
        DeploymentError: the SuperLink did not answer (so nothing is submitted to it).
    """
    return control_api.runs(home, connection)
