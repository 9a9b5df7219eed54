"""Before `cuvil-edge run` submits: is every listed site enrolled, and which are online?

A site the federation lists (its site file's ``site:`` id) that the home's registry does not
hold can never join, so the run is refused at once. An enrolled site that is offline may be
starting: the run waits for it up to the federation's ``start_timeout``, then starts without it if
at least ``min_sites`` (default: all) are online, and is refused otherwise. The decision is
:func:`decide`, a function of what is enrolled and online and how long we have waited;
:func:`wait_for_sites` asks the registry and the SuperLink and applies it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cuvil_edge.errors import ConfigError

#: Seconds between two looks at the SuperLink's node list while waiting.
POLL_SECONDS = 2.0


class SitesNotReadyError(ConfigError):
    """Listed sites are not enrolled, or too few are online to start the run."""


@dataclass(frozen=True)
class Decision:
    """``start``: submit now (``missing``: the offline sites it starts without); else keep waiting
    for ``missing``."""

    start: bool
    missing: tuple[str, ...] = ()


def decide(
    listed: Mapping[str, Path],
    enrolled: set[str],
    online: set[str],
    *,
    min_sites: int | None,
    waited: float,
    start_timeout: float,
) -> Decision:
    """What to do now, ``waited`` seconds after the first look.

    Args:
        listed: site id -> the site file the federation lists.
        enrolled: site ids in the home's registry.
        online: site ids whose node the SuperLink has online.
        min_sites: fewest sites a round needs (None: all listed).

    Raises:
        SitesNotReadyError: a listed site is not enrolled; or the deadline passed with fewer than
            ``min_sites`` online (the message names the offline sites).
    """
    _refuse_strangers(listed, enrolled)
    offline = tuple(site for site in listed if site not in online)
    if not offline:
        return Decision(start=True)
    if waited < start_timeout:
        return Decision(start=False, missing=offline)
    needed = min_sites or len(listed)
    up = len(listed) - len(offline)
    if up >= needed:
        return Decision(start=True, missing=offline)
    raise SitesNotReadyError(
        f"{', '.join(offline)} {'are' if len(offline) > 1 else 'is'} enrolled but offline after {start_timeout:g} s "
        f"(start_timeout), and the run needs {needed} of {len(listed)} sites online (min_sites), {up} are: start "
        "the device (`cuvil-edge agent run`), lower min_sites, or remove the site from `sites:`"
    )


def _refuse_strangers(listed: Mapping[str, Path], enrolled: set[str]) -> None:
    """Raises: SitesNotReadyError: a listed site is not enrolled (it could never join)."""
    strangers = [site for site in listed if site not in enrolled]
    if strangers:
        named = ", ".join(f"{site} ({listed[site]})" for site in strangers)
        raise SitesNotReadyError(
            f"site{'s' if len(strangers) > 1 else ''} {named} {'are' if len(strangers) > 1 else 'is'} not enrolled in "
            "this coordinator home: enroll its device with `cuvil-edge coordinator enroll ENROLLMENT.json`, or "
            "remove it from the federation's `sites:`"
        )


def wait_for_sites(
    home: Path,
    listed: Mapping[str, Path],
    *,
    min_sites: int | None,
    start_timeout: float,
    echo: Callable[[str], None] = print,
    online: Callable[[], set[str]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, ...]:
    """Wait (see :func:`decide`) until the run may start; the offline sites it starts without.
    Says once which sites it waits for, and, when it goes on without some, which.

    Raises:
        SitesNotReadyError: see :func:`decide`.
        DeploymentError: the home has no SuperLink, or it does not answer.
        StateError: the registry is unreadable.
    """
    from cuvil_edge.coordinator.registry import SiteRegistry

    registry = SiteRegistry(home).sites()
    enrolled = set(registry)
    online = online or (lambda: online_sites(home, registry))
    began, said = clock(), False
    while True:
        waited = clock() - began
        up = online()  # first, so that a home without a SuperLink says that before anything else
        decision = decide(listed, enrolled, up, min_sites=min_sites, waited=waited, start_timeout=start_timeout)
        if decision.start:
            if decision.missing:
                echo(
                    f"starting without {', '.join(decision.missing)} (offline after {start_timeout:g} s; "
                    f"{len(listed) - len(decision.missing)} of {len(listed)} sites are online, min_sites "
                    f"{min_sites or len(listed)})"
                )
            return decision.missing
        if not said:
            echo(f"waiting up to {start_timeout:g} s for {', '.join(decision.missing)} (enrolled, offline)")
            said = True
        sleep(min(POLL_SECONDS, max(0.0, start_timeout - waited)))


def online_sites(home: Path, registry: Mapping[str, dict]) -> set[str]:
    """The enrolled sites whose registered node the SuperLink has online (what `flwr supernode list` lists).

    Raises:
        DeploymentError: no SuperLink is configured in ``home``, or it did not answer.
    """
    from cuvil_edge.coordinator import control_api
    from cuvil_edge.coordinator.superlink import CONNECTION, no_superlink

    if not control_api.config_file(home).exists():
        raise no_superlink(home)
    nodes = control_api.nodes(home, CONNECTION)
    up = {
        str(n.get("node-id"))
        for n in (nodes if isinstance(nodes, list) else [])
        if isinstance(n, dict) and n.get("status") == "online"
    }
    return {site for site, entry in registry.items() if entry.get("node_id") and str(entry["node_id"]) in up}
