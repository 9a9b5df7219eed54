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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.coordinator.keys import SigningKeys
from cuvil_edge.coordinator.precision import PRECISIONS, with_precision
from cuvil_edge.errors import KeyFileError, PlanError, StateError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.infer import with_initializers
from cuvil_edge.ir_serialize import SignedRelease, encode_payload, sign_release, write_package
from cuvil_edge.passes.quantize import dequantize_at_load


@dataclass(frozen=True)
class IssuedPackage:
    site: str
    version: int
    data: bytes


def weights_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the weights' names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}\0{value.dtype.str}\0{value.shape}\0".encode())
        digest.update(value.data)
    return digest.hexdigest()


class FrozenWeights(Mapping[str, np.ndarray]):
    """Read-only copies of one set of global weights, hashed once.

    A round's phase issues every site's package from the same weights; given these,
    :class:`PackageFactory` keys its per-round cache (quantized variants, encoded payloads) by
    :attr:`digest` instead of hashing the whole model again for every site. They are copies, so a
    later write to the caller's arrays cannot make a cached package stale.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._arrays = {}
        for name, value in arrays.items():
            frozen = np.array(value)
            frozen.flags.writeable = False
            self._arrays[name] = frozen
        self.digest = weights_digest(self._arrays)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


@dataclass
class _RoundCache:
    """What the factory made from one set of weights, per precision."""

    digest: str
    variants: dict[str, Graph] = field(default_factory=dict)
    shipped: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    payloads: dict[str, tuple[bytes, SignedRelease]] = field(default_factory=dict)  # and the release signing it


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

    def __init__(
        self,
        graph: Graph,
        sites: Sequence[SiteConfig],
        signing_key: SigningKeys,
        versions: VersionCounter,
        validity_seconds: int,
        clock: Callable[[], float] = time.time,
        package: str = "model",
        seal_keys: Mapping[str, Any] | None = None,
        refused: Mapping[str, str] | None = None,
        precisions: Mapping[str, str] | None = None,
        calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
        quantization_method: str = "mse",
    ) -> None:
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
        #: site -> the precision its plan chose (fp32 when absent)
        self.precisions = dict(precisions or {})
        unknown = {s: p for s, p in self.precisions.items() if p not in PRECISIONS}
        if unknown:
            raise PlanError(f"sites {unknown} were planned at an unknown precision; use one of {', '.join(PRECISIONS)}")
        int8 = sorted(s for s, p in self.precisions.items() if p == "int8")
        if int8 and calibration is None:
            raise PlanError(
                f"sites {int8} were planned at int8, which needs calibration samples; give the federation "
                "file a quantization.calibration .npz"
            )
        self.calibration = None if calibration is None else list(calibration)
        self.quantization_method = quantization_method
        self._round: _RoundCache | None = None

    def graph_with(self, arrays: Mapping[str, np.ndarray]) -> Graph:
        """The model graph carrying ``arrays`` as its weights."""
        return with_initializers(self.graph, arrays)

    def _new_release(self, payload: bytes) -> SignedRelease:
        """A release statement for ``payload`` under the next release counter (the round cache keeps
        it, so every site issued this payload gets the same one)."""
        counter = self.versions.next(f"release:{self.package}")
        targets = sorted({s.target for s in self.sites.values()})
        return sign_release(payload, self.package, counter, targets, self.keys.release)

    def _cached(self, arrays: Mapping[str, np.ndarray]) -> _RoundCache:
        """What was made from these weights so far; started afresh when the weights change (keyed
        by content: :class:`FrozenWeights` carry their digest, other mappings are hashed here)."""
        key = arrays.digest if isinstance(arrays, FrozenWeights) else weights_digest(arrays)
        if self._round is None or self._round.digest != key:
            self._round = _RoundCache(key)
        return self._round

    def variant(self, site: str, arrays: Mapping[str, np.ndarray]) -> Graph:
        """The model with ``arrays`` as ``site``'s package carries it: at the precision its plan chose
        (fp16 storage halves the download; int8 is quantized on the calibration samples, again for
        every new set of weights, since the activation ranges depend on them)."""
        return self._variant(self.precisions.get(site, "fp32"), self._cached(arrays), arrays)

    def _variant(self, precision: str, cache: _RoundCache, arrays: Mapping[str, np.ndarray]) -> Graph:
        if precision not in cache.variants:
            graph = self.graph_with(arrays)
            cache.variants[precision] = (
                graph
                if precision == "fp32"
                else with_precision(graph, precision, self.calibration, self.quantization_method)[0]
            )
        return cache.variants[precision]

    def shipped(self, site: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` as ``site`` starts training from them: its package's weights after the agent's
        load fold (int8 and fp16 rounding included). The coordinator adds each site's update to the
        exact weights (:meth:`SitePackages.reanchor`), so the rounding never accumulates in the model."""
        precision = self.precisions.get(site, "fp32")
        if precision == "fp32":
            return dict(arrays)
        cache = self._cached(arrays)
        if precision not in cache.shipped:
            loaded = dequantize_at_load(self._variant(precision, cache, arrays)).initializers
            cache.shipped[precision] = {k: np.asarray(loaded[k], dtype=np.asarray(v).dtype) for k, v in arrays.items()}
        return cache.shipped[precision]

    def issue(self, site: str, arrays: Mapping[str, np.ndarray]) -> IssuedPackage:
        """A freshly versioned, signed package of the model with ``arrays`` for ``site``.

        Raises:
            PlanError: the site's compile plan does not fit its limits (:attr:`refused`).
        """
        if site in self.refused:
            raise PlanError(f"not pushing to site {site!r}: {self.refused[site]}")
        config = self.sites[site]
        precision, cache = self.precisions.get(site, "fp32"), self._cached(arrays)
        if precision not in cache.payloads:  # one encoding per precision and round, whatever the number of sites
            payload = encode_payload(self._variant(precision, cache, arrays))
            cache.payloads[precision] = (payload, self._new_release(payload))
        payload, release = cache.payloads[precision]
        now = int(self.clock())
        version = self.versions.next(site)
        data = write_package(
            None,
            site=site,
            target=config.target,
            version=version,
            signing_key=self.keys.coordinator,
            issued_at=now,
            expires=now + self.validity_seconds,
            release=release,
            payload=payload,
            seal_to=self.seal_keys.get(site),
            roots=self.keys.roots,
        )
        return IssuedPackage(site, version, data)
