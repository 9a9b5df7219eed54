"""`cuvil-edge status`: enrolled sites, which are online, the federation's round, each site's ε.

Read from the coordinator home: the registry (enrolled sites and their node ids), the
SuperLink (which nodes are online, when it is reachable), the newest run's report (rounds and the
ε each site reported) and the checkpoints (the last completed round).
"""

from __future__ import annotations

import json
import subprocess
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
    """The last non-empty line of what ``flwr`` said (its conclusion; earlier lines are progress
    such as "Using SuperLink: ..."), shown inert and short."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return shown(lines[-1] if lines else "no answer", limit)


def online_node_ids(home: Path) -> tuple[set[str] | None, str, bool | None]:
    """(node ids online, what to say about the SuperLink, whether it answered). ``flwr supernode
    list`` exits 0 with ``{"success": false, "error-message": ...}`` when it cannot connect, so
    only a JSON answer with ``success: true`` counts as reachable."""
    from cuvil_edge.coordinator.superlink import CONNECTION, flwr_cli

    if not (Path(home) / "flwr" / "config.toml").exists():
        return None, "not started here (`cuvil-edge coordinator serve`)", None
    try:
        proc = flwr_cli(home, "supernode", "list", CONNECTION, "--format", "json", timeout=30)
    except subprocess.TimeoutExpired:
        return None, "not reachable (`flwr supernode list` did not answer in 30 s)", False
    except Exception as e:  # noqa: BLE001 - any failure to ask is reported, never raised
        return None, f"not reachable ({_reason(f'{type(e).__name__}: {e}')})", False
    return _read_list(proc)


def _read_list(proc: subprocess.CompletedProcess) -> tuple[set[str] | None, str, bool]:
    """What ``flwr supernode list --format json`` answered, as :func:`online_node_ids` returns it."""
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        said = proc.stderr if proc.stderr.strip() else proc.stdout
        why = f"exit {proc.returncode}: " if proc.returncode else "no JSON answer: "
        return None, f"not reachable (`flwr supernode list` {why}{_reason(said)})", False
    if doc.get("success") is not True or proc.returncode:
        said = doc.get("error-message") or proc.stderr or f"exit {proc.returncode}"
        return None, f"not reachable ({_reason(said)})", False
    listed = doc.get("nodes")
    nodes = listed if isinstance(listed, list) else []
    return (
        {str(n.get("node-id")) for n in nodes if isinstance(n, dict) and n.get("status") == "online"},
        "reachable",
        True,
    )


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
