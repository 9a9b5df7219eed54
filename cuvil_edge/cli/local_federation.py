"""A whole federation on Flower's deployment engine on 127.0.0.1: `cuvil-edge demo --deployment`.

A coordinator home with a CA and server certificate, one device per site (own home, node and
sealing keys, pinned root and CA), every device enrolled, a SuperLink with TLS and node
authentication, and one SuperNode per site. Both sides are composed here, at the top layer, from
the same functions the operator's commands use (`coordinator init/certs/enroll/serve`,
`agent init/run`). Every process started is stopped by PID on exit.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from cuvil_edge.agent.daemon import gate_command, start_agent, supernode_command
from cuvil_edge.agent.enroll import init_site
from cuvil_edge.config import load_federation, load_site
from cuvil_edge.config.flower_app import APP_DIR  # noqa: F401 - the app `run` and `demo` submit
from cuvil_edge.coordinator import control_api
from cuvil_edge.coordinator.registry import SiteRegistry, init_home
from cuvil_edge.coordinator.superlink import (
    CONNECTION,
    Coordinator,
    DeploymentError,
    free_port,
    start_superlink,
)
from cuvil_edge.coordinator.tls import make_certs


@dataclass
class LocalFederation:
    home: Path  # the coordinator home
    address: str
    device_homes: list[Path]
    superlink: Coordinator  # the loopback SuperLink, its ServerApp executor and the Fleet gateway
    supernodes: list[subprocess.Popen]
    #: each SuperNode's ClientApp executor (agent/app_gate.py), in the SuperNode's process group
    gates: list[subprocess.Popen] = field(default_factory=list)

    def online(self) -> int:
        """How many SuperNodes the SuperLink sees online."""
        try:
            return sum(n.get("status") == "online" for n in control_api.nodes(self.home, CONNECTION))
        except DeploymentError:  # not answering yet
            return 0

    def wait_online(self, timeout: float = 180) -> None:
        """Raises: DeploymentError: not every SuperNode came online in time."""
        deadline = time.monotonic() + timeout
        while self.online() < len(self.supernodes) and time.monotonic() < deadline:
            time.sleep(1)
        if self.online() < len(self.supernodes):
            raise DeploymentError(f"only {self.online()} of {len(self.supernodes)} SuperNodes came online")

    def restart_superlink(self, log_file: Path | None = None) -> None:
        """Kill the coordinator's processes (SIGKILL, as a crash would) and start them again on the same home."""
        self.superlink.kill()
        self.superlink = start_superlink(
            self.home, self.address, log_file=log_file, operator_address=self.superlink.operator_address
        )


def set_up(root: Path, federation: Path) -> tuple[Path, list[tuple[Path, Path]]]:
    """Coordinator home and one enrolled device per site under ``root``; (home, [(site file, device home)])."""
    home = init_home(root / "coordinator")
    make_certs(home / "tls", ["127.0.0.1"])
    devices = []
    for i, path in enumerate(load_federation(federation).sites):
        device = root / f"device-{i}"
        setup = init_site(load_site(path), home / "keys" / "root.json", ca=home / "tls" / "ca.crt", home=device)
        SiteRegistry(home).enroll(setup.enrollment)
        devices.append((path, device))
    return home, devices


@contextmanager
def local_federation(root: Path, federation: Path) -> Iterator[LocalFederation]:
    """Set up, start and (on exit) stop a federation on 127.0.0.1; logs go to ``root``.

    Raises:
        DeploymentError / ConfigError: it could not be set up or started.
    """
    home, devices = set_up(Path(root), federation)
    address = f"127.0.0.1:{free_port()}"
    link = start_superlink(
        home, address, log_file=Path(root) / "superlink.log", operator_address=f"127.0.0.1:{free_port()}"
    )
    fed = LocalFederation(home, address, [d for _, d in devices], link, [])
    try:
        for i, (site_file, device) in enumerate(devices):
            site, port = load_site(site_file), free_port()
            command = supernode_command(site, site_file, device, address, port, (i, len(devices)))
            node, gate = start_agent(
                command,
                device,
                partial(gate_command, site, device, port),
                stdout=open(Path(root) / f"supernode-{i}.log", "wb"),
                stderr=subprocess.STDOUT,
            )
            fed.supernodes.append(node)
            fed.gates.append(gate)  # type: ignore[arg-type]  # a gate command gives a gate process
        fed.wait_online()
        yield fed
    finally:
        for proc in fed.supernodes + fed.gates:
            if proc.poll() is None:
                proc.terminate()
        for proc in fed.supernodes + fed.gates:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        fed.superlink.terminate()
