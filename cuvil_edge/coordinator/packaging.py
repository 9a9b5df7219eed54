"""Per-site package building on the coordinator.

Each site gets its own signed manifest (its site id, its target, its own
monotonically increasing version) over the same payload.  Version counters are
durable so a restarted coordinator never re-issues a version an agent has
already accepted (agents reject anything not strictly newer).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.errors import StateError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.infer import with_initializers
from cuvil_edge.ir_serialize import write_package


@dataclass(frozen=True)
class IssuedPackage:
    site: str
    version: int
    data: bytes


class VersionCounter:
    """Durable per-site version counters (a small JSON file, replaced atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.versions: dict[str, int] = self._read()

    def _read(self) -> dict[str, int]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StateError(f"{self.path}: unreadable version counters ({e}); restore it from backup") from e
        if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
            raise StateError(f"{self.path}: version counters must map site ids to ints")
        return data

    def next(self, site: str) -> int:
        """Reserve and durably record the next version for ``site``."""
        self.versions[site] = self.versions.get(site, 0) + 1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(self.versions, sort_keys=True).encode("utf-8"))
        return self.versions[site]


class PackageFactory:
    """Signs one package per site from the current global weights."""

    def __init__(self, graph: Graph, sites: Sequence[SiteConfig], signing_key, versions: VersionCounter,
                 validity_seconds: int, clock: Callable[[], float] = time.time) -> None:
        self.graph = graph
        self.sites = {s.site: s for s in sites}
        self.signing_key = signing_key
        self.versions = versions
        self.validity_seconds = validity_seconds
        self.clock = clock

    def graph_with(self, arrays: Mapping[str, np.ndarray]) -> Graph:
        """The model graph carrying ``arrays`` as its weights."""
        return with_initializers(self.graph, arrays)

    def issue(self, site: str, arrays: Mapping[str, np.ndarray]) -> IssuedPackage:
        """A freshly versioned, signed package of the model with ``arrays`` for ``site``."""
        config = self.sites[site]
        now = int(self.clock())
        version = self.versions.next(site)
        data = write_package(self.graph_with(arrays), site=site, target=config.target, version=version,
                             signing_key=self.signing_key, issued_at=now, expires=now + self.validity_seconds)
        return IssuedPackage(site, version, data)
