"""Durable anti-rollback state (PACKAGE_SPEC §11): trusted root, per-site versions, release
counters and the time floor, in one file replaced atomically."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import (
    DigestConflictError, PackageError, PackageFormatError, ReleaseRollbackError, RollbackError, StateError,
    UnsupportedFormatError,
)
from cuvil_edge.ir_serialize._canonical import (
    canonical_json, check_str, fields, get_int, get_list, hex_digest, parse_json,
)
from cuvil_edge.ir_serialize.trust import TrustRoot, load_pinned_root, parse_root_envelope

log = logging.getLogger(__name__)

STATE_FILE = "anti_rollback.json"
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
class _Doc:
    root: Any  # the trusted root envelope object, or None
    revoked: tuple[str, ...]
    snapshot: RollbackSnapshot


class AntiRollbackState:
    """``<directory>/anti_rollback.json``, re-read on every call; never reset automatically."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STATE_FILE

    def snapshot(self) -> RollbackSnapshot:
        """Raises: StateError: the state file is unreadable or corrupt."""
        return self._read().snapshot

    def last_version(self, site: str) -> int | None:
        """Raises: StateError: the state file is unreadable or corrupt."""
        entry = self._read().snapshot.sites.get(site)
        return entry.version if entry else None

    def last_accepted(self, site: str) -> AcceptedVersion | None:
        """Raises: StateError: the state file is unreadable or corrupt."""
        return self._read().snapshot.sites.get(site)

    def trust_root(self, pinned: bytes, now: int | None = None) -> TrustRoot:
        """The trusted root: the one stored here, else the pinned root.json (self-signed, §10.2).

        Raises:
            StateError: the state file is corrupt.
            RootRotationError / PackageFormatError: the pinned root is not acceptable.
        """
        doc = self._read()
        if doc.root is None:
            return load_pinned_root(pinned, now)
        try:
            env, root = parse_root_envelope(doc.root)
            root.verify(env, "root")
        except PackageError as e:
            raise StateError(f"the trusted root stored in {self.path} is corrupt ({e})") from e
        return TrustRoot(root.version, root.expires, root.keys, root.roles, frozenset(doc.revoked))

    def accept(self, site: str, version: int, digest: str, *, release: tuple[str, int] | None = None,
               issued_at: int = 0, root: Optional[TrustRoot] = None, root_envelope: Any = None) -> None:
        """Durably record an accepted package (§11.3); call before activating it.

        Equal ``version`` with the same ``digest`` is an idempotent re-delivery.

        Raises:
            RollbackError: lower version; DigestConflictError: equal version, other digest;
            ReleaseRollbackError: lower release counter.
            StateError: the state is corrupt or cannot be written.
        """
        doc = self._read()
        snap = doc.snapshot
        prev = snap.sites.get(site)
        if prev is not None and version < prev.version:
            raise RollbackError(f"site {site!r} already accepted version {prev.version}; cannot record {version}")
        if prev is not None and version == prev.version and digest != prev.digest:
            raise DigestConflictError(f"site {site!r} version {version} was accepted with another digest")
        releases = dict(snap.releases)
        if release is not None:
            if release[1] < releases.get(release[0], 0):
                raise ReleaseRollbackError(f"release {release[0]!r} counter {release[1]} is below the accepted "
                                           f"{releases[release[0]]}")
            releases[release[0]] = release[1]
        sites = {**snap.sites, site: AcceptedVersion(version, digest)}
        new_root, revoked = doc.root, doc.revoked
        if root is not None and root_envelope is not None and root.version > snap.root_version:
            new_root, revoked = root_envelope, tuple(sorted(root.revoked))
        self._write(_Doc(new_root, revoked, RollbackSnapshot(
            root.version if root is not None else snap.root_version, max(snap.time_floor, issued_at), sites, releases)))
        log.info("site %s accepted package version %d (%s)", site, version, digest[:16])

    def _write(self, doc: _Doc) -> None:
        s = doc.snapshot
        try:
            data = canonical_json({
                "format": STATE_FORMAT, "root": doc.root, "revoked": list(doc.revoked), "time_floor": s.time_floor,
                "sites": {k: {"version": v.version, "digest": hex_digest(v.digest, "digest")} for k, v in s.sites.items()},
                "releases": dict(s.releases)}, "anti-rollback state")
        except PackageFormatError as e:
            raise StateError(f"refusing to record invalid state: {e}") from e
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write(self.path, data, mode=0o600)  # temp, fsync, replace, fsync dir (§11.3)
        except OSError as e:
            raise StateError(f"cannot write anti-rollback state {self.path}: {e}; fix the state directory") from e

    def _read(self) -> _Doc:
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return _Doc(None, (), RollbackSnapshot())
        except OSError as e:
            raise StateError(f"cannot read anti-rollback state {self.path}: {e}") from e
        if len(data) > MAX_STATE_BYTES:
            raise StateError(f"anti-rollback state {self.path} is over {MAX_STATE_BYTES} bytes; it is corrupt")
        try:
            return _from_doc(parse_json(data, "anti-rollback state", canonical=False))
        except PackageFormatError as e:
            raise StateError(f"anti-rollback state {self.path} is corrupt ({e}); restore it from backup or "
                             "re-provision the site. It is never reset automatically.") from e


def _from_doc(obj: Any) -> _Doc:
    d = fields(obj, _KEYS, "anti-rollback state")
    if get_int(d, "format", "anti-rollback state") != STATE_FORMAT:
        raise UnsupportedFormatError(f"state format {d['format']} is not supported (this reader: {STATE_FORMAT})")
    root_version = 0
    if d["root"] is not None:
        root_version = parse_root_envelope(d["root"])[1].version
    revoked = tuple(hex_digest(k, "revoked key id") for k in get_list(d, "revoked", "state"))
    if not isinstance(d["sites"], dict) or not isinstance(d["releases"], dict):
        raise PackageFormatError("state 'sites' and 'releases' must be JSON objects")
    sites = {}
    for site, entry in d["sites"].items():
        where = f"state entry for site {check_str(site, 'site id')!r}"
        e = fields(entry, ("version", "digest"), where)
        sites[site] = AcceptedVersion(get_int(e, "version", where), hex_digest(e["digest"], where))
    releases = {check_str(k, "release name"): get_int(d["releases"], k, "state releases") for k in d["releases"]}
    return _Doc(d["root"], revoked, RollbackSnapshot(root_version, get_int(d, "time_floor", "state"), sites, releases))
