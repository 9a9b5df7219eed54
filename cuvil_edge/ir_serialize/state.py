"""Durable anti-rollback state (PACKAGE_SPEC §11): the trusted root, per-site versions, release
counters and the time floor, in one file replaced atomically under an exclusive lock.

The state is the agent's only source of trust: it is initialised once from the pinned
root.json (:meth:`AntiRollbackState.initialise`) and afterwards changes only through
``verify_and_accept``, which reads it, verifies a package against it and writes the result in
one locked transaction.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import PackageError, PackageFormatError, StateError, UnsupportedFormatError
from cuvil_edge.ir_serialize._canonical import (
    canonical_json,
    check_name,
    fields,
    get_int,
    get_list,
    hex_digest,
    parse_json,
)
from cuvil_edge.ir_serialize.trust import TrustRoot, load_pinned_root

log = logging.getLogger(__name__)

STATE_FILE = "anti_rollback.json"
LOCK_FILE = "anti_rollback.lock"
STATE_FORMAT = 2
MAX_STATE_BYTES = 4 * 2**20
_KEYS = ("format", "root", "revoked", "time_floor", "sites", "releases")


@dataclass(frozen=True)
class AcceptedVersion:
    """The newest package a site accepted, and its manifest digest."""

    version: int
    digest: str


@dataclass(frozen=True)
class RollbackSnapshot:
    """What verification compares against (§11.2); a pure value."""

    root_version: int = 0
    time_floor: int = 0
    sites: Mapping[str, AcceptedVersion] = field(default_factory=dict)
    releases: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TrustState:
    """The whole state document, decoded and checked: the trusted root (with the key ids revoked
    by every rotation applied so far) and the floors packages are compared against."""

    root: TrustRoot | None
    root_envelope: Any  # exactly the envelope object of ``root``; None before initialisation
    snapshot: RollbackSnapshot

    def require_root(self, where: Path) -> TrustRoot:
        """Raises: StateError: the state was never initialised from a pinned root.json."""
        if self.root is None:
            raise StateError(
                f"{where} holds no trusted root yet; initialise the agent's state from the "
                "federation's root.json first (`cuvil-edge agent init`)"
            )
        return self.root


EMPTY = TrustState(None, None, RollbackSnapshot())


class AntiRollbackState:
    """``<directory>/anti_rollback.json``, re-read in every transaction; never reset automatically.

    Every read-modify-write holds an exclusive ``flock`` on ``anti_rollback.lock`` so concurrent
    deliveries (threads or processes) are serialised; opening the state removes temp files left
    by a writer that was killed mid-write.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        """Raises: StateError: the directory cannot be created or locked."""
        self.directory = Path(directory)
        self.path = self.directory / STATE_FILE
        with self._locked():
            for leftover in self.directory.glob(f".{STATE_FILE}.*.tmp"):
                log.warning("removing %s, left by a state writer that did not finish", leftover)
                leftover.unlink(missing_ok=True)

    def initialise(self, pinned: bytes, now: int | None = None) -> TrustRoot:
        """Trust ``pinned`` (root.json bytes, self-signed, §10.2) unless a root is already stored;
        the stored root then wins and ``pinned`` is ignored.  Returns the trusted root.

        Raises:
            RootRotationError / ExpiredRootError / PackageFormatError: the pinned root is not acceptable.
            StateError: the state is corrupt or cannot be written.
        """
        with self.transaction() as txn:
            if txn.current.root is not None:
                return txn.current.root
            root = load_pinned_root(pinned, now)
            txn.commit(
                replace(
                    txn.current,
                    root=root,
                    root_envelope=parse_json(pinned, "root.json", canonical=False),
                    snapshot=replace(txn.current.snapshot, root_version=root.version),
                )
            )
            log.info("trust initialised from the pinned root.json v%d", root.version)
            return root

    def read(self) -> TrustState:
        """The current state (read-only).

        Raises:
            StateError: the state file is unreadable or corrupt.
        """
        return self._read()

    def trust_root(self) -> TrustRoot:
        """Raises: StateError: corrupt, or not initialised (:meth:`initialise`)."""
        return self._read().require_root(self.path)

    def snapshot(self) -> RollbackSnapshot:
        """Raises: StateError: the state file is unreadable or corrupt."""
        return self._read().snapshot

    def last_accepted(self, site: str) -> AcceptedVersion | None:
        """Raises: StateError: the state file is unreadable or corrupt."""
        return self._read().snapshot.sites.get(site)

    @contextmanager
    def transaction(self) -> Iterator[_Transaction]:
        """Exclusive read-modify-write: ``txn.current`` is the state as read under the lock;
        ``txn.commit(new)`` writes ``new`` durably (§11.3) before the lock is released.

        Raises:
            StateError: the state is corrupt, or cannot be locked or written.
        """
        with self._locked():
            yield _Transaction(self, self._read())

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StateError(f"cannot open the state lock in {self.directory}: {e}; fix the state directory") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write(self, state: TrustState) -> None:
        s = state.snapshot
        revoked = sorted(state.root.revoked) if state.root is not None else []
        try:
            data = canonical_json(
                {
                    "format": STATE_FORMAT,
                    "root": state.root_envelope,
                    "revoked": revoked,
                    "time_floor": s.time_floor,
                    "sites": {
                        k: {"version": v.version, "digest": hex_digest(v.digest, "digest")} for k, v in s.sites.items()
                    },
                    "releases": dict(s.releases),
                },
                "anti-rollback state",
            )
        except PackageFormatError as e:
            raise StateError(f"refusing to record invalid state: {e}") from e
        try:
            atomic_write(self.path, data, mode=0o600)  # temp, fsync, replace, fsync dir (§11.3)
        except OSError as e:
            raise StateError(f"cannot write anti-rollback state {self.path}: {e}; fix the state directory") from e

    def _read(self) -> TrustState:
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return EMPTY
        except OSError as e:
            raise StateError(f"cannot read anti-rollback state {self.path}: {e}") from e
        if len(data) > MAX_STATE_BYTES:
            raise StateError(f"anti-rollback state {self.path} is over {MAX_STATE_BYTES} bytes; it is corrupt")
        try:
            return _from_doc(parse_json(data, "anti-rollback state", canonical=False))
        except PackageError as e:
            raise StateError(
                f"anti-rollback state {self.path} is corrupt ({e}); restore it from backup or "
                "re-provision the site. It is never reset automatically."
            ) from e


class _Transaction:
    """One locked read-modify-write of the state (see :meth:`AntiRollbackState.transaction`)."""

    def __init__(self, owner: AntiRollbackState, current: TrustState) -> None:
        self.owner, self.current = owner, current

    def commit(self, new: TrustState) -> None:
        """Raises: StateError: the state cannot be written (the old one stays)."""
        self.owner._write(new)
        self.current = new


def _from_doc(obj: Any) -> TrustState:
    d = fields(obj, _KEYS, "anti-rollback state")
    if get_int(d, "format", "anti-rollback state") != STATE_FORMAT:
        raise UnsupportedFormatError(f"state format {d['format']} is not supported (this reader: {STATE_FORMAT})")
    revoked = frozenset(hex_digest(k, "revoked key id") for k in get_list(d, "revoked", "state"))
    root = None
    if d["root"] is not None:
        root = replace(load_pinned_root(d["root"]), revoked=revoked)  # still meets its own root threshold
    elif revoked:
        raise PackageFormatError("state lists revoked keys but no trusted root")
    if not isinstance(d["sites"], dict) or not isinstance(d["releases"], dict):
        raise PackageFormatError("state 'sites' and 'releases' must be JSON objects")
    sites = {}
    for site, entry in d["sites"].items():
        where = f"state entry for site {check_name(site, 'site id')!r}"
        e = fields(entry, ("version", "digest"), where)
        sites[site] = AcceptedVersion(get_int(e, "version", where), hex_digest(e["digest"], where))
    releases = {check_name(k, "release name"): get_int(d["releases"], k, "state releases") for k in d["releases"]}
    snapshot = RollbackSnapshot(root.version if root else 0, get_int(d, "time_floor", "state"), sites, releases)
    return TrustState(root, d["root"], snapshot)
