"""Durable anti-rollback state: the last accepted package version per site (PACKAGE_SPEC §9)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuvil_edge.errors import PackageFormatError, RollbackError, StateError
from cuvil_edge.atomic import atomic_write
from cuvil_edge.ir_serialize._canonical import canonical_json, check_int, check_str, fields, get_int, parse_json

log = logging.getLogger(__name__)

STATE_FILE = "anti_rollback.json"
STATE_FORMAT = 1
MAX_STATE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class AcceptedVersion:
    """The newest package a site accepted, and its payload digest."""

    version: int
    digest: str


class AntiRollbackState:
    """The state file ``<directory>/anti_rollback.json``, re-read on every call.

    A missing file means nothing was accepted yet.  A file that cannot be read
    or parsed raises :class:`StateError`: it is never silently reset, because a
    reset would re-open every rollback it was guarding against.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STATE_FILE

    def last_version(self, site: str) -> int | None:
        """The last version ``site`` accepted, or ``None`` if none.

        Raises:
            StateError: the state file is unreadable or corrupt.
        """
        entry = self._read().get(site)
        return entry.version if entry else None

    def last_accepted(self, site: str) -> AcceptedVersion | None:
        """The last accepted version and digest of ``site``, or ``None``.

        Raises:
            StateError: the state file is unreadable or corrupt.
        """
        return self._read().get(site)

    def accept(self, site: str, version: int, digest: str) -> None:
        """Durably record that ``site`` accepted ``version`` (payload sha256 ``digest``).

        Raises:
            RollbackError: ``version`` is not greater than the recorded one.
            StateError: the state file is corrupt, or cannot be written.
        """
        entries = self._read()
        previous = entries.get(site)
        if previous is not None and version <= previous.version:
            raise RollbackError(f"site {site!r} already accepted version {previous.version}; cannot record {version}")
        try:
            entries[site] = AcceptedVersion(check_int(version, "version"), _check_digest(digest))
            data = canonical_json(_to_doc(entries), "anti-rollback state")
        except PackageFormatError as e:
            raise StateError(f"refusing to record site {site!r} version {version!r}: {e}") from e
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write(self.path, data, mode=0o600)
        except OSError as e:
            raise StateError(f"cannot write anti-rollback state {self.path}: {e}; fix the state directory") from e
        log.info("site %s accepted package version %d (%s)", site, version, digest[:16])

    def _read(self) -> dict[str, AcceptedVersion]:
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise StateError(f"cannot read anti-rollback state {self.path}: {e}") from e
        if len(data) > MAX_STATE_BYTES:
            raise StateError(f"anti-rollback state {self.path} is over {MAX_STATE_BYTES} bytes; it is corrupt")
        try:
            return _from_doc(parse_json(data, "anti-rollback state", canonical=False))
        except PackageFormatError as e:
            raise StateError(
                f"anti-rollback state {self.path} is corrupt ({e}); restore it from backup or re-provision the site. "
                "It is never reset automatically."
            ) from e


def _check_digest(digest: Any) -> str:
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise PackageFormatError("digest must be 64 lowercase hex digits")
    return digest


def _to_doc(entries: dict[str, AcceptedVersion]) -> dict[str, Any]:
    return {"format": STATE_FORMAT,
            "sites": {site: {"version": e.version, "digest": e.digest} for site, e in sorted(entries.items())}}


def _from_doc(doc: Any) -> dict[str, AcceptedVersion]:
    doc = fields(doc, ("format", "sites"), "anti-rollback state")
    if get_int(doc, "format", "anti-rollback state") != STATE_FORMAT:
        raise PackageFormatError(f"state format {doc['format']} is not supported (this reader: {STATE_FORMAT})")
    sites = doc["sites"]
    if not isinstance(sites, dict):
        raise PackageFormatError("field 'sites' must be a JSON object")
    result = {}
    for site, entry in sites.items():
        where = f"state entry for site {check_str(site, 'site id')!r}"
        e = fields(entry, ("version", "digest"), where)
        result[site] = AcceptedVersion(get_int(e, "version", where), _check_digest(e["digest"]))
    return result
