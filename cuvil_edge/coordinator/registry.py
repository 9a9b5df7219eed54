"""The coordinator home and its site registry.

A coordinator home (``cuvil-edge coordinator init --home DIR``) holds, for the federation's
whole life::

    keys/            trust root and role keys (config/home.py keys_dir; root.key can move offline)
    versions.json    per-site package version counters
    sites.json       the site registry: site -> target, node auth public key, seal public key
    tls/             CA and SuperLink certificate (coordinator/tls.py)
    checkpoints/     the global model after each completed round (checkpoint-mac.key authenticates them)
    superexec.secret the SuperLink Runtime API's secret (`serve`, coordinator/superlink.py)

Enrolling a site (``cuvil-edge coordinator enroll FILE``) records its node key and seal key; one
site has one node key and one node key belongs to one site. Packages for an enrolled site are
sealed for its seal key.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.enrollment import Enrollment, canonical_node_key
from cuvil_edge.config.home import keys_dir, versions_file
from cuvil_edge.config.site import SITE_ID_PATTERN
from cuvil_edge.coordinator.keys import init_keys
from cuvil_edge.errors import ConfigError, KeyFileError, StateError

REGISTRY_FILE = "sites.json"
REGISTRY_FORMAT = 1


def init_home(home: Path, *, force: bool = False) -> Path:
    """Create a coordinator home: keys and root.json v1, empty counters and registry, folders.

    Raises:
        KeyFileError: ``home`` already holds keys and ``force`` is not set.
    """
    home = Path(home)
    init_keys(keys_dir(home), force=force)
    for folder in ("tls", "checkpoints"):
        (home / folder).mkdir(mode=0o700, parents=True, exist_ok=True)
    if force or not versions_file(home).exists():
        atomic_write(versions_file(home), b"{}", mode=0o600)
    if force or not (home / REGISTRY_FILE).exists():
        SiteRegistry(home)._write({})
    return home


class SiteRegistry:
    """``<home>/sites.json``: one entry per enrolled site, replaced atomically."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / REGISTRY_FILE

    def sites(self) -> dict[str, dict[str, Any]]:
        """Raises: StateError: the registry is unreadable or malformed."""
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicates)
        except (OSError, ValueError) as e:
            raise StateError(f"{self.path}: unreadable site registry ({e}); restore it from backup") from e
        if not isinstance(doc, dict) or doc.get("format") != REGISTRY_FORMAT or not isinstance(doc.get("sites"), dict):
            raise StateError(f"{self.path}: not a site registry (format {REGISTRY_FORMAT})")
        return doc["sites"]

    def entry_for(self, enrollment: Enrollment, *, replace: bool = False) -> dict[str, Any]:
        """The entry :meth:`enroll` would record for ``enrollment``, after every check; writes nothing.

        Raises:
            ConfigError: the site is enrolled with another node key (pass ``replace`` to move it
                to a new device), or the node key already belongs to another site.
            StateError: the registry cannot be read.
        """
        return self._entry(self.sites(), enrollment, replace)

    def enroll(
        self, enrollment: Enrollment, *, replace: bool = False, registered: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Record ``enrollment``; returns the entry. ``registered`` is the entry as
        ``register_enrolled`` registered it with a running SuperLink (its node id, and the replaced
        registrations still to withdraw): those are kept instead of the ones computed here.

        Raises:
            ConfigError: see :meth:`entry_for`.
            StateError: the registry cannot be read or written.
        """
        sites = self.sites()
        entry = self._entry(sites, enrollment, replace)
        if registered is not None:
            entry = {k: v for k, v in entry.items() if k not in ("node_id", "unregister")}
            entry.update({k: registered[k] for k in ("node_id", "unregister") if registered.get(k)})
        self._write({**sites, enrollment.site: entry})
        return entry

    def node_key(self, site: str, entry: dict[str, Any]) -> str:
        """The canonical OpenSSH line of ``entry``'s node key (older versions stored the line as
        given: with its comment, or whitespace, even non-ASCII whitespace, around it).

        Raises:
            StateError: the site id or the stored key is malformed (a hand-edited registry); enroll
                the site again with --replace.
        """
        key = _stored_key(entry)
        if not re.fullmatch(SITE_ID_PATTERN, str(site)) or key is None:
            raise StateError(
                f"{self.path}: site {str(site)!r:.80} has a malformed site id or node key; enroll it "
                "again (`cuvil-edge coordinator enroll FILE --replace`) or remove its entry"
            )
        return key

    def set_node_id(self, site: str, node_id: str, *, unregister: list[str] | tuple[str, ...] = ()) -> None:
        """Record the node id the SuperLink gave the site's registered key, and which replaced
        registrations are still to be withdrawn (none: all were).

        Raises:
            StateError: the site is not enrolled, or the registry cannot be written.
        """
        sites = self.sites()
        if site not in sites:
            raise StateError(f"site {site!r} is not enrolled in {self.path}")
        entry = {k: v for k, v in sites[site].items() if k != "unregister"}
        entry["node_id"] = node_id
        if unregister:
            entry["unregister"] = list(unregister)
        self._write({**sites, site: entry})

    @staticmethod
    def _entry(sites: dict[str, dict[str, Any]], enrollment: Enrollment, replace: bool) -> dict[str, Any]:
        key = enrollment.node_public_key  # canonical: Enrollment makes it so; stored ones are made so here
        for name, entry in sites.items():
            if name != enrollment.site and _stored_key(entry) == key:
                raise ConfigError(f"this node key is already enrolled as site {name!r}; one device is one site")
        old = sites.get(enrollment.site)
        same = old is not None and _stored_key(old) == key
        if old is not None and not same and not replace:
            raise ConfigError(
                f"site {enrollment.site!r} is enrolled with another node key; a second device cannot "
                "be the same site. If the device was replaced, enroll again with --replace"
            )
        entry = {
            "target": enrollment.target,
            "node_public_key": key,
            "seal_public_key": enrollment.seal_public_key,
            "enrolled_at": int(time.time()),
        }
        if same and old is not None:  # the same device again: still registered, and what was to withdraw still is
            entry.update({k: old[k] for k in ("node_id", "unregister") if old.get(k)})
        elif old is not None:  # a replaced device: its old registration is withdrawn (`serve` does it)
            retired = list(old.get("unregister", [])) + ([old["node_id"]] if old.get("node_id") else [])
            if retired:
                entry["unregister"] = retired
        return entry

    def seal_keys(self) -> dict[str, X25519PublicKey]:
        """Each enrolled site's sealing key (packages for it are sealed by default).

        Raises:
            StateError: the registry is unreadable.
            KeyFileError: a stored key is malformed.
        """
        keys = {}
        for site, entry in self.sites().items():
            try:
                keys[site] = X25519PublicKey.from_public_bytes(bytes.fromhex(entry["seal_public_key"]))
            except (KeyError, ValueError) as e:
                raise KeyFileError(f"{self.path}: site {site!r} has a malformed seal key ({e})") from e
        return keys

    def _write(self, sites: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            data = json.dumps({"format": REGISTRY_FORMAT, "sites": sites}, indent=2, sort_keys=True) + "\n"
            atomic_write(self.path, data.encode("utf-8"), mode=0o600)
        except OSError as e:
            raise StateError(f"cannot write the site registry {self.path}: {e}") from e


def _stored_key(entry: dict[str, Any]) -> str | None:
    """A stored node key in canonical form, or None if it is none (it then equals no key)."""
    raw = entry.get("node_public_key") if isinstance(entry, dict) else None
    try:  # strip(): older versions accepted any whitespace at the ends, even non-ASCII
        return canonical_node_key(raw.strip()) if isinstance(raw, str) else None
    except ConfigError:
        return None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return doc
