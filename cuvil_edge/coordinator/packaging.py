"""Per-site package building on the coordinator.

Each site gets its own signed manifest (its site id, its target, its own
monotonically increasing version) over the same payload.  Version counters are
durable so a restarted coordinator never re-issues a version an agent has
already accepted (agents reject anything not strictly newer).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.coordinator.keys import SigningKeys
from cuvil_edge.errors import KeyFileError, PlanError, StateError
from cuvil_edge.passes.quantize import store_fp16
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.infer import with_initializers
from cuvil_edge.ir_serialize import SignedRelease, encode_payload, sign_release, write_package


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
    """Signs one package per site from the current global weights (PACKAGE_SPEC §3).

    ``signing_key`` is a :class:`~cuvil_edge.coordinator.keys.SigningKeys` (coordinator key,
    release key, root chain).  Every distinct payload gets one release statement with the next
    release counter; each site then gets its own manifest (and, when ``seal_keys`` has the site,
    a payload sealed for it).
    """

    def __init__(self, graph: Graph, sites: Sequence[SiteConfig], signing_key: SigningKeys, versions: VersionCounter,
                 validity_seconds: int, clock: Callable[[], float] = time.time, package: str = "model",
                 seal_keys: Mapping[str, Any] | None = None, refused: Mapping[str, str] | None = None,
                 precisions: Mapping[str, str] | None = None) -> None:
        if not isinstance(signing_key, SigningKeys):
            raise KeyFileError("PackageFactory needs SigningKeys (coordinator.keys.load_signing_keys), not a bare key")
        self.graph = graph
        self.sites = {s.site: s for s in sites}
        self.keys = signing_key
        self.versions = versions
        self.validity_seconds = validity_seconds
        self.clock = clock
        self.package = package
        self.seal_keys = dict(seal_keys or {})
        #: site -> why its compile plan does not fit (coordinator.plan): it is issued nothing
        self.refused = dict(refused or {})
        #: site -> the precision its plan chose (fp32 when absent); int8 needs calibration samples,
        #: which a federation does not provide yet, so a run issues fp32 or fp16
        self.precisions = dict(precisions or {})
        unsupported = {s: p for s, p in self.precisions.items() if p not in ("fp32", "fp16")}
        if unsupported:
            raise PlanError(f"sites {unsupported} were planned at a precision a run cannot issue yet; "
                            "federation runs issue fp32 or fp16 packages")
        self._release: tuple[str, SignedRelease] | None = None

    def graph_with(self, arrays: Mapping[str, np.ndarray]) -> Graph:
        """The model graph carrying ``arrays`` as its weights."""
        return with_initializers(self.graph, arrays)

    def _release_for(self, payload: bytes) -> SignedRelease:
        digest = hashlib.sha256(payload).hexdigest()
        if self._release is None or self._release[0] != digest:
            counter = self.versions.next(f"release:{self.package}")
            targets = sorted({s.target for s in self.sites.values()})
            self._release = (digest, sign_release(payload, self.package, counter, targets, self.keys.release))
        return self._release[1]

    def issue(self, site: str, arrays: Mapping[str, np.ndarray]) -> IssuedPackage:
        """A freshly versioned, signed package of the model with ``arrays`` for ``site``.

        Raises:
            PlanError: the site's compile plan does not fit its limits (:attr:`refused`).
        """
        if site in self.refused:
            raise PlanError(f"not pushing to site {site!r}: {self.refused[site]}")
        config = self.sites[site]
        graph = self.graph_with(arrays)
        if self.precisions.get(site, "fp32") == "fp16":  # half the download; the agent widens it at load
            graph = store_fp16(graph)
        payload = encode_payload(graph)
        release = self._release_for(payload)
        now = int(self.clock())
        version = self.versions.next(site)
        data = write_package(None, site=site, target=config.target, version=version, signing_key=self.keys.coordinator,
                             issued_at=now, expires=now + self.validity_seconds, release=release, payload=payload,
                             seal_to=self.seal_keys.get(site), roots=self.keys.roots)
        return IssuedPackage(site, version, data)
