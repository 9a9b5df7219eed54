"""`cuvil-edge status`: enrolled sites, which are online, the federation's round, each site's ε.

Read from the coordinator home: the registry (enrolled sites and their node ids), the
SuperLink (which nodes are online, when it is reachable), the newest run's report (rounds and the
ε each site reported) and the checkpoints (the last completed round).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cuvil_edge.coordinator.registry import SiteRegistry


@dataclass(frozen=True)
class SiteStatus:
    site: str
    target: str
    registered: bool
    online: bool | None  # None: the SuperLink could not be asked
    last_status: str | None
    eps_spent: float | None
    eps_remaining: float | None


@dataclass(frozen=True)
class FederationStatus:
    sites: list[SiteStatus]
    superlink: str  # "reachable", or why not
    last_round: int | None
    run_dir: Path | None


def _online_node_ids(home: Path) -> tuple[set[str] | None, str]:
    from cuvil_edge.coordinator.superlink import CONNECTION, flwr_cli

    if not (Path(home) / "flwr" / "config.toml").exists():
        return None, "not started here (`cuvil-edge coordinator serve`)"
    try:
        proc = flwr_cli(home, "supernode", "list", CONNECTION, "--format", "json", timeout=30)
        nodes = json.loads(proc.stdout).get("nodes", [])
    except Exception as e:  # noqa: BLE001 - any failure to ask is reported, never raised
        return None, f"not reachable ({type(e).__name__})"
    return {str(n.get("node-id")) for n in nodes if n.get("status") == "online"}, "reachable"


def shown(value: object, limit: int = 64) -> str:
    """A stored string as a terminal may show it: every character that is not printable (ANSI
    escapes, other controls, odd whitespace) written as its Python escape, at most ``limit``
    characters. Registries of older versions stored targets unchecked."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def federation_status(home: Path) -> FederationStatus:
    """What an operator wants to see first.

    Raises:
        StateError: the registry is unreadable.
    """
    home = Path(home)
    runs = sorted((home / "runs").glob("run-*")) if (home / "runs").exists() else []
    reported: dict = {}
    last_round = None
    run_dir = None
    for candidate in reversed(runs):
        path = candidate / "metrics.json"
        if path.exists():
            rounds = json.loads(path.read_text(encoding="utf-8")).get("rounds", [])
            if rounds:
                run_dir, last_round, reported = candidate, rounds[-1]["round"], rounds[-1].get("sites", {})
                break
    online, superlink = _online_node_ids(home)
    sites = []
    for site, entry in sorted(SiteRegistry(home).sites().items()):
        stats = reported.get(site, {})
        last = stats.get("status")
        sites.append(SiteStatus(shown(site), shown(entry.get("target", "?")), bool(entry.get("node_id")),
                                None if online is None else str(entry.get("node_id")) in online,
                                None if last is None else shown(last), stats.get("eps-spent"),
                                stats.get("eps-remaining")))
    return FederationStatus(sites, superlink, last_round, run_dir)
