"""The agent's inference path: receive -> verify -> accept -> build -> run.

Imports neither torch nor onnx, so a box without PyTorch can still verify,
compile and run packages.  All IO of the agent's state directory happens here:

    <state_dir>/rollback.json     anti-rollback state (PACKAGE_SPEC, state file)
    <state_dir>/ledger.sqlite     privacy ledger
    <state_dir>/packages/         received packages, by payload digest
    <state_dir>/build-cache/      compiled modules (pruned source kept for people)
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.device_targets import CompiledModel, build, load_target
from cuvil_edge.ir_serialize import AntiRollbackState, VerifiedPackage, load_public_key, open_package
from cuvil_edge.privacy import PrivacyLedger

#: Largest package an agent accepts (PACKAGE_SPEC limits); big enough for ResNet-class models.
MAX_PACKAGE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Activated:
    """A verified, accepted and compiled package."""

    package: VerifiedPackage
    model: CompiledModel
    package_bytes: int
    verify_seconds: float


class AgentRuntime:
    """One site's agent: owns its state directory and pinned coordinator key."""

    def __init__(self, site: SiteConfig, state_dir: Path, coordinator_public_key: Path,
                 clock=time.time) -> None:
        self.site = site
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.public_key = load_public_key(Path(coordinator_public_key))
        self.target = load_target(site.target)
        self.rollback = AntiRollbackState(self.state_dir)
        self.clock = clock

    def ledger(self) -> PrivacyLedger:
        p = self.site.privacy
        return PrivacyLedger(self.state_dir / "ledger.sqlite", site=self.site.site,
                             epsilon_budget=p.epsilon_budget, delta=p.delta)

    def _store(self, data: bytes) -> Path:
        """Write received bytes durably under their digest (names never come from the package)."""
        folder = self.state_dir / "packages"
        folder.mkdir(exist_ok=True)
        path = folder / f"{hashlib.sha256(data).hexdigest()}.cpkg"
        atomic_write(path, data)
        return path

    def activate(self, data: bytes) -> Activated:
        """Verify a package, record it as accepted, and build it for this site's target.

        Raises:
            PackageError: any verification failure (nothing is accepted or built).
            StateError: the anti-rollback state is unreadable.
            TargetError: the build failed.
        """
        path = self._store(data)
        start = time.perf_counter()
        package = open_package(path, public_key=self.public_key, site=self.site.site, target=self.target.name,
                               now=int(self.clock()), last_version=self.rollback.last_version(self.site.site),
                               max_package_bytes=MAX_PACKAGE_BYTES)
        verify_seconds = time.perf_counter() - start
        # Durable before use: a crash after this point can never re-open an older package.
        self.rollback.accept(self.site.site, package.manifest.version, package.payload_digest)
        model = build(package, self.target.name, cache_dir=self.state_dir / "build-cache",
                      precision=self.site.precision)
        return Activated(package, model, len(data), verify_seconds)

    @staticmethod
    def accuracy(model: CompiledModel, x: np.ndarray, y: np.ndarray) -> float:
        """Fraction of ``x`` whose argmax output equals ``y``."""
        name = model.graph.inputs[0].name
        out = next(iter(model.run({name: x}).values()))
        return float((out.argmax(axis=1) == y).mean())
