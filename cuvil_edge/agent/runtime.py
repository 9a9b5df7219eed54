"""The agent's inference path: receive -> verify -> accept -> build -> run.

Imports neither torch nor onnx, so a box without PyTorch can still verify,
compile and run packages.  All IO of the agent's state directory happens here:

    <state_dir>/anti_rollback.json  trusted root + anti-rollback state (PACKAGE_SPEC §11)
    <state_dir>/keys/seal.key     the site's sealing key (`cuvil-edge agent keys init`), optional
    <state_dir>/ledger.sqlite     privacy ledger
    <state_dir>/packages/         verified packages only, v<version>-<manifest sha256>.cpkg, the newest N kept
    <state_dir>/build-cache/      compiled modules (pruned source kept for people)

The state directory holds the site's keys, its ledger and code the agent runs, so it is private
(:func:`check_state_dir`): created 0700, and refused when it or an entry directly in it is a link,
another user's, or writable by group or others (`cuvil-edge agent init` makes one of ours 0700).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuvil_edge import private_dir
from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.device_targets import CompiledModel, build, load_target
from cuvil_edge.errors import KeyFileError, PackageSizeError, StateError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize import AntiRollbackState, VerifiedPackage, verify_and_accept
from cuvil_edge.passes.quantize import dequantize_at_load
from cuvil_edge.privacy import PrivacyLedger

log = logging.getLogger(__name__)
PACKAGES_DIR = "packages"


@dataclass(frozen=True)
class Activated:
    """A verified, accepted and compiled package."""

    package: VerifiedPackage
    model: CompiledModel
    package_bytes: int
    verify_seconds: float
    #: the package's graph with its weights in float (what training and its checks read); ``model``
    #: runs the int8 products as the integer ops where the target has int8 kernels
    graph: Graph | None = None


@dataclass(frozen=True)
class _Loaded:
    """What build() needs: the graph as loaded (weights dequantized) and the package's digest."""

    graph: Graph
    payload_digest: str


def check_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` 0700 (missing parents too), or check the one there and each entry
    directly in it: none may be a link, another user's, or writable by group or others. Deeper
    entries are checked where they are read (the build cache checks its own).

    Raises:
        UnsafePathError: what is wrong, and the chmod/chown that fixes it.
        StateError: the directory cannot be created.
    """
    try:
        private_dir.ensure_private_dir(state_dir, what="state directory", disposable=False)
        private_dir.check_entries(state_dir, what="state directory", disposable=False)
    except OSError as e:
        raise StateError(
            f"cannot create or read the state directory {state_dir}: {e}; fix its path or permissions"
        ) from e


class AgentRuntime:
    """One site's agent: owns its state directory, pinned trust root and sealing key.

    ``trust_root`` is the federation's root.json (PACKAGE_SPEC §10) used on first start;
    afterwards the root stored in the state directory (updated by rotations the packages carry) wins.
    """

    def __init__(
        self, site: SiteConfig, state_dir: Path, trust_root: Path | None, clock=time.time, seal_key: Path | None = None
    ) -> None:
        """``trust_root`` (root.json) initialises a new state; None: the state must already hold
        one (`cuvil-edge agent init` pinned it).

        Raises:
            KeyFileError: ``trust_root`` is not a readable root.json.
            StateError: no ``trust_root`` and the state was never initialised.
            UnsafePathError: the state directory is not private (:func:`check_state_dir`).
        """
        self.site = site
        self.state_dir = Path(state_dir)
        check_state_dir(self.state_dir)
        self.target = load_target(site.target)
        self.clock = clock
        self.rollback = AntiRollbackState(self.state_dir)
        if trust_root is None:
            self.rollback.trust_root()  # refuses an uninitialised state now, not at the first package
        else:
            if Path(trust_root).suffix != ".json":
                raise KeyFileError(
                    f"{trust_root}: agents pin the federation's root.json (PACKAGE_SPEC §10), not a bare key"
                )
            try:
                pinned = Path(trust_root).read_bytes()
            except OSError as e:
                raise KeyFileError(f"cannot read the pinned trust root {trust_root}: {e}") from e
            self.rollback.initialise(pinned)  # once; afterwards the state's own root is authoritative
        seal_path = Path(seal_key) if seal_key else self.state_dir / "keys" / "seal.key"
        self.seal_key = None
        if seal_key or seal_path.exists():
            from cuvil_edge.ir_serialize.sealing import load_seal_private

            self.seal_key = load_seal_private(seal_path)

    def ledger(self) -> PrivacyLedger:
        p = self.site.privacy
        return PrivacyLedger(
            self.state_dir / "ledger.sqlite", site=self.site.site, epsilon_budget=p.epsilon_budget, delta=p.delta
        )

    @property
    def max_package_bytes(self) -> int:
        return self.site.agent.max_package_bytes

    def activate(self, data: bytes) -> Activated:
        """Verify a package from memory, record it as accepted, keep it, and build it for this target.

        Nothing touches the disk before the package is verified and accepted: the size cap is
        checked first, verification runs on ``data`` in memory, and only then is the package
        kept (the newest ``agent.keep_packages`` per site).

        Raises:
            PackageError: any verification failure (nothing is accepted, kept or built).
            StateError: the anti-rollback state is unreadable or cannot be written.
            TargetError: the build failed.
        """
        if len(data) > self.max_package_bytes:
            raise PackageSizeError(
                f"the package is {len(data)} bytes, over this site's limit of "
                f"{self.max_package_bytes} (agent.max_package_bytes in the site YAML)"
            )
        start = time.perf_counter()
        package = verify_and_accept(
            data,
            self.rollback,
            site=self.site.site,
            target=self.target.name,
            now=int(self.clock()),
            max_package_bytes=self.max_package_bytes,
            seal_key=self.seal_key,
        )
        verify_seconds = time.perf_counter() - start
        self._keep(data, package)
        # fp16-stored or int8 weights are widened once here, not on every run (and the build cache
        # then keys on the float structure, so a new round's quantized weights still hit it); a
        # target with an int8 dot product runs the QDQ-wrapped products as the integer ops instead
        loaded = dequantize_at_load(package.graph)
        runs = dequantize_at_load(package.graph, int8=True) if self.target.int8_kernels else loaded
        model = build(
            _Loaded(runs, package.payload_digest),
            self.target.name,
            cache_dir=self.state_dir / "build-cache",
            precision=self.site.precision,
        )
        return Activated(package, model, len(data), verify_seconds, loaded)

    def kept_packages(self) -> list[Path]:
        """The verified packages kept on disk, oldest version first."""
        return sorted((self.state_dir / PACKAGES_DIR).glob("v*-*.cpkg"))

    def _keep(self, data: bytes, package: VerifiedPackage) -> None:
        """Store a verified package durably, then prune to the newest ``agent.keep_packages``.

        Names come from the verified manifest (version, digest), never from the sender.
        """
        folder = self.state_dir / PACKAGES_DIR
        path = folder / f"v{package.manifest.version:020d}-{package.manifest_digest}.cpkg"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            if not path.exists():
                atomic_write(path, bytes(data), mode=0o600)
            for old in self.kept_packages()[: -self.site.agent.keep_packages]:
                old.unlink(missing_ok=True)
        except OSError as e:
            raise StateError(f"cannot keep the verified package in {folder}: {e}; fix the state directory") from e

    @staticmethod
    def correct(model: CompiledModel, x: np.ndarray, y: np.ndarray) -> int:
        """How many rows of ``x`` have their argmax output equal to ``y``."""
        name = model.graph.inputs[0].name
        out = next(iter(model.run({name: x}).values()))
        return int((out.argmax(axis=1) == y).sum())
