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

#: `cuvil-edge status`'s exit code when the home's SuperLink does not answer (the report is still
#: printed); a home where none was ever started exits 0.
SUPERLINK_DOWN_EXIT = 1


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
    #: True: the SuperLink answered; False: this home's SuperLink did not (it is down, or the
    #: ``flwr`` CLI failed); None: no SuperLink was ever started for this home.
    reachable: bool | None = None


def _reason(text: str, limit: int = 200) -> str:
    """The last non-empty line of an error (its conclusion), shown inert and short."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return shown(lines[-1] if lines else "no answer", limit)


def online_node_ids(home: Path) -> tuple[set[str] | None, str, bool | None]:
    """(node ids online, what to say about the SuperLink, whether it answered): the SuperLink's
    node list (what `flwr supernode list` asks); any failure to get it is reported, never raised."""
    from cuvil_edge.coordinator import control_api
    from cuvil_edge.coordinator.superlink import CONNECTION

    if not control_api.config_file(home).exists():
        return None, "not started here (`cuvil-edge coordinator serve`)", None
    try:
        nodes = control_api.nodes(home, CONNECTION)
    except Exception as e:  # noqa: BLE001 - any failure to ask is reported, never raised
        said = str(e) if isinstance(e, control_api.ControlAPIError) else f"{type(e).__name__}: {e}"
        return None, f"not reachable ({_reason(said)})", False
    return {str(n.get("node-id")) for n in nodes if n.get("status") == "online"}, "reachable", True


def shown(value: object, limit: int = 64) -> str:
    """A stored string as a terminal may show it: every character that is not printable (ANSI
    escapes, other controls, odd whitespace) written as its Python escape, at most ``limit``
    characters. Registries of older versions stored targets unchecked."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    online, superlink, reachable = online_node_ids(home)
    sites = []
    for site, entry in sorted(SiteRegistry(home).sites().items()):
        stats = reported.get(site, {})
        last = stats.get("status")
        sites.append(
            SiteStatus(
                shown(site),
                shown(entry.get("target", "?")),
                bool(entry.get("node_id")),
                None if online is None else str(entry.get("node_id")) in online,
                None if last is None else shown(last),
                stats.get("eps-spent"),
                stats.get("eps-remaining"),
            )
        )
    return FederationStatus(sites, superlink, last_round, run_dir, reachable)
