"""A whole federation on Flower's deployment engine on 127.0.0.1: `cuvil-edge demo --deployment`.

A coordinator home with a CA and server certificate, one device per site (own home, node and
sealing keys, pinned root and CA), every device enrolled, a SuperLink with TLS and node
authentication, and one SuperNode per site. Both sides are composed here, at the top layer, from
the same functions the operator's commands use (`coordinator init/certs/enroll/serve`,
`agent init/run`). Every process started is stopped by PID on exit.
"""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cuvil_edge.agent.daemon import supernode_command
from cuvil_edge.agent.enroll import init_site
from cuvil_edge.config import load_federation, load_site
from cuvil_edge.config.flower_env import flwr_env
from cuvil_edge.coordinator.registry import SiteRegistry, init_home
from cuvil_edge.coordinator.superlink import CONNECTION, DeploymentError, flwr_cli, free_port, start_superlink
from cuvil_edge.coordinator.tls import make_certs


#: The Flower App `cuvil-edge run` submits: a pyproject and a module naming the ServerApp and the
#: ClientApp; no cuvil-edge code, so each machine runs its own installed cuvil-edge. It lives here,
#: at the top layer, because it names both sides.
APP_DIR = Path(__file__).resolve().parent / "flwr_app"


@dataclass
class LocalFederation:
    home: Path  # the coordinator home
    address: str
    device_homes: list[Path]
    superlink: subprocess.Popen
    supernodes: list[subprocess.Popen]

    def online(self) -> int:
        """How many SuperNodes the SuperLink sees online."""
        out = flwr_cli(self.home, "supernode", "list", CONNECTION, "--format", "json", timeout=60)
        try:
            return sum(n.get("status") == "online" for n in json.loads(out.stdout).get("nodes", []))
        except ValueError:
            return 0

    def wait_online(self, timeout: float = 180) -> None:
        """Raises: DeploymentError: not every SuperNode came online in time."""
        deadline = time.monotonic() + timeout
        while self.online() < len(self.supernodes) and time.monotonic() < deadline:
            time.sleep(1)
        if self.online() < len(self.supernodes):
            raise DeploymentError(f"only {self.online()} of {len(self.supernodes)} SuperNodes came online")

    def restart_superlink(self, log_file: Path | None = None) -> None:
        """Kill the SuperLink (SIGKILL, as a crash would) and start it again on the same home."""
        self.superlink.kill()
        self.superlink.wait(timeout=30)
        self.superlink = start_superlink(self.home, self.address, log_file=log_file)


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
    link = start_superlink(home, address, log_file=Path(root) / "superlink.log")
    fed = LocalFederation(home, address, [d for _, d in devices], link, [])
    try:
        for i, (site_file, device) in enumerate(devices):
            command = supernode_command(load_site(site_file), site_file, device, address, free_port(),
                                        (i, len(devices)))
            fed.supernodes.append(subprocess.Popen(command, env=flwr_env(device), stdout=open(Path(root) /
                                                   f"supernode-{i}.log", "wb"), stderr=subprocess.STDOUT))
        fed.wait_online()
        yield fed
    finally:
        for proc in fed.supernodes + [fed.superlink]:
            if proc.poll() is None:
                proc.terminate()
        for proc in fed.supernodes + [fed.superlink]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
