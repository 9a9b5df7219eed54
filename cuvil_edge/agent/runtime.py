"""The agent's inference path: receive -> verify -> accept -> build -> run.

Imports neither torch nor onnx, so a box without PyTorch can still verify,
compile and run packages.  All IO of the agent's state directory happens here:

    <state_dir>/anti_rollback.json  trusted root + anti-rollback state (PACKAGE_SPEC §11)
    <state_dir>/keys/seal.key     the site's sealing key (`cuvil-edge agent keys init`), optional
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
from cuvil_edge.errors import KeyFileError
from cuvil_edge.ir_serialize import AntiRollbackState, VerifiedPackage, open_package
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
    """One site's agent: owns its state directory, pinned trust root and sealing key.

    ``trust_root`` is the federation's root.json (PACKAGE_SPEC §10) used on first start;
    afterwards the root stored in the state directory (updated by rotations the packages carry) wins.
    """

    def __init__(self, site: SiteConfig, state_dir: Path, trust_root: Path, clock=time.time,
                 seal_key: Path | None = None) -> None:
        self.site = site
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.root_path = Path(trust_root)
        if self.root_path.suffix != ".json":
            raise KeyFileError(f"{trust_root}: agents pin the federation's root.json (PACKAGE_SPEC §10), not a bare key")
        try:
            self.pinned_root = self.root_path.read_bytes()
        except OSError as e:
            raise KeyFileError(f"cannot read the pinned trust root {trust_root}: {e}") from e
        self.target = load_target(site.target)
        self.rollback = AntiRollbackState(self.state_dir)
        self.clock = clock
        seal_path = Path(seal_key) if seal_key else self.state_dir / "keys" / "seal.key"
        self.seal_key = None
        if seal_key or seal_path.exists():
            from cuvil_edge.ir_serialize.sealing import load_seal_private

            self.seal_key = load_seal_private(seal_path)

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
        now = int(self.clock())
        root = self.rollback.trust_root(self.pinned_root)
        package = open_package(path, trust_root=root, site=self.site.site, target=self.target.name, now=now,
                               state=self.rollback.snapshot(), max_package_bytes=MAX_PACKAGE_BYTES,
                               seal_key=self.seal_key)
        verify_seconds = time.perf_counter() - start
        # Durable before use (PACKAGE_SPEC §11.3): a crash after this point never re-opens an older package.
        m = package.manifest
        self.rollback.accept(m.site, m.version, package.manifest_digest,
                             release=(package.release.package, package.release.release_counter),
                             issued_at=m.issued_at, root=package.root, root_envelope=package.root_envelope)
        model = build(package, self.target.name, cache_dir=self.state_dir / "build-cache",
                      precision=self.site.precision)
        return Activated(package, model, len(data), verify_seconds)

    @staticmethod
    def accuracy(model: CompiledModel, x: np.ndarray, y: np.ndarray) -> float:
        """Fraction of ``x`` whose argmax output equals ``y``."""
        name = model.graph.inputs[0].name
        out = next(iter(model.run({name: x}).values()))
        return float((out.argmax(axis=1) == y).mean())
