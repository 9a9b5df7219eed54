"""`cuvil-edge agent run`: the site's SuperNode, restarted with back-off while the coordinator is away.

The SuperNode authenticates with the site's node key, trusts only the pinned CA, and carries the
site's own settings in its node config (its site file and home): the ClientApp it starts reads
everything from there, nothing from the coordinator. Its identity, ledger and anti-rollback state
live in the state directory, so a restart continues where it stopped.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from cuvil_edge.agent.enroll import CA_FILE, NODE_KEY
from cuvil_edge.config.home import site_state_dir
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.config.flower_env import flower_tool, flwr_env
from cuvil_edge.errors import ConfigError

log = logging.getLogger(__name__)

#: What flower-supernode 1.42 logs when the SuperLink refuses its key (Flower's exit code 305; the
#: process itself exits with status 1, so the log line is what tells a refusal from an outage).
REFUSED_MARK = "Exit Code: 305"
REFUSED_EXIT = 305


def supernode_command(site: SiteConfig, site_file: Path, home: Path, superlink: str, port: int,
                      partition: tuple[int, int] = (0, 1)) -> list[str]:
    """``flower-supernode`` for ``site``: TLS to the pinned CA, node authentication, own node config.

    Raises:
        ConfigError: the device was not set up (`cuvil-edge agent init`).
    """
    state = site_state_dir(site, home)
    key, ca = state / "keys" / NODE_KEY, state / CA_FILE
    for path in (key, ca):
        if not path.exists():
            raise ConfigError(f"{path} is missing; set the device up with `cuvil-edge agent init --site ... --ca ...`")
    node_config = (f"site-config='{Path(site_file).resolve()}' home='{Path(home).resolve()}' "
                   f"partition-id={partition[0]} num-partitions={partition[1]}")
    return [flower_tool("flower-supernode"), "--root-certificates", str(ca), "--superlink", superlink,
            "--auth-supernode-private-key", str(key), "--node-config", node_config, "--port", str(port)]


def run_once(command: list[str], home: Path) -> tuple[int, bool]:
    """Run the SuperNode once, passing its output through; (exit status, whether it was refused)."""
    refused = False
    with subprocess.Popen(command, env=flwr_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            refused = refused or REFUSED_MARK in line
    return proc.returncode, refused


def run_forever(command: list[str], home: Path, *, max_backoff: float = 60.0) -> int:
    """Run the SuperNode; when it exits (coordinator away, network lost), restart it after a
    growing pause. Returns :data:`REFUSED_EXIT` only when the SuperLink refuses the node's key.
    """
    backoff = 1.0
    while True:
        started = time.monotonic()
        code, refused = run_once(command, home)
        if refused:
            log.error("the SuperLink refused this node's key; enroll it (`cuvil-edge coordinator enroll`)")
            return REFUSED_EXIT
        backoff = 1.0 if time.monotonic() - started > 300 else min(max_backoff, backoff * 2)
        log.warning("the SuperNode exited with %s; restarting in %.0f s", code, backoff)
        time.sleep(backoff)
