"""The enrollment file: the public material a device hands its coordinator (shared by both sides).

``cuvil-edge agent init`` writes it on the device; ``cuvil-edge coordinator enroll`` reads it.
It holds only public keys::

    {"format": 1, "site": "hospital-a", "target": "jetson-orin-nano",
     "node_public_key": "ecdsa-sha2-nistp384 AAAA...",   # Flower node authentication (OpenSSH)
     "seal_public_key": "<64 hex>"}                       # X25519, packages are sealed for it

Every :class:`Enrollment` is checked and canonical: the node key is the one OpenSSH line
cryptography writes for it (no comment, no extra whitespace), so one key is one string whatever
the file said around it; the target is a known device spec.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cuvil_edge.config.site import SITE_ID_PATTERN
from cuvil_edge.errors import ConfigError, UnknownTargetError

ENROLLMENT_FORMAT = 1
_FIELDS = ("format", "site", "target", "node_public_key", "seal_public_key")
_HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_BYTES = 16 * 1024


@dataclass(frozen=True)
class Enrollment:
    """One device's enrollment; built only from checked values (the node key canonicalised).

    Raises (on construction):
        ConfigError: a bad site id, an unknown target, or keys of the wrong kind.
    """

    site: str
    target: str
    node_public_key: str
    seal_public_key: str

    def __post_init__(self) -> None:
        if not all(isinstance(v, str) for v in (self.site, self.target, self.node_public_key, self.seal_public_key)):
            raise ConfigError("site, target and keys must be strings")
        if not re.fullmatch(SITE_ID_PATTERN, self.site):  # fullmatch: "$" alone lets a final newline in
            raise ConfigError(f"site id {self.site!r:.80} must match {SITE_ID_PATTERN}")
        object.__setattr__(self, "target", known_target(self.target))
        object.__setattr__(self, "node_public_key", canonical_node_key(self.node_public_key))
        if not _HEX64.fullmatch(self.seal_public_key):
            raise ConfigError("seal_public_key must be 64 lowercase hex digits (X25519)")

    def to_json(self) -> str:
        return json.dumps({"format": ENROLLMENT_FORMAT, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str, where: str) -> Enrollment:
        """Strict parse; every field is checked.

        Raises:
            ConfigError: not JSON, a key given twice, unknown or missing fields, a bad site id, an
                unknown target (UnknownTargetError), or keys of the wrong kind.
        """
        try:
            doc = json.loads(text, object_pairs_hook=_no_duplicates)
        except ValueError as e:
            raise ConfigError(f"{where}: not an enrollment file (invalid JSON: {e})") from e
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from e
        if not isinstance(doc, dict) or sorted(doc) != sorted(_FIELDS):
            raise ConfigError(f"{where}: an enrollment file has exactly the fields {list(_FIELDS)}")
        if type(doc["format"]) is not int or doc["format"] != ENROLLMENT_FORMAT:  # not true, not 1.0
            raise ConfigError(f"{where}: enrollment format {doc['format']!r:.40} is not supported (this reader: 1)")
        try:
            return Enrollment(doc["site"], doc["target"], doc["node_public_key"], doc["seal_public_key"])
        except ConfigError as e:  # the same type, naming the file
            raise type(e)(f"{where}: {e}") from e

    @staticmethod
    def read(path: Path) -> Enrollment:
        """Raises: ConfigError: unreadable, too large or malformed."""
        try:
            data = Path(path).read_bytes()[: MAX_BYTES + 1]
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the enrollment file ({e.strerror})") from e
        if len(data) > MAX_BYTES:
            raise ConfigError(f"{path}: over {MAX_BYTES} bytes; not an enrollment file")
        return Enrollment.from_json(data.decode("utf-8", errors="replace"), str(path))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` keeps the last of two equal keys; an enrollment file must not hold two."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        twice = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise ConfigError(
            f"the key(s) {', '.join(repr(k)[:40] for k in twice)} appear twice; write each field "
            "once (copy the file exactly as `cuvil-edge agent init` wrote it)"
        )
    return doc


def known_target(name: str) -> str:
    """``name`` if a shipped device spec has it (the same rule as a site YAML's ``target``).

    Raises:
        UnknownTargetError: no spec has this name (the message lists the known ones).
        TargetSpecError: the spec file is unreadable or invalid.
    """
    from cuvil_edge.device_targets import list_targets, load_target

    known = list_targets()
    if name not in known:  # checked first: the name is untrusted and maybe huge, shown shortened
        raise UnknownTargetError(
            f"unknown device target {name!r:.60}; known targets: {', '.join(known)}. "
            "The device's site YAML must name one of them"
        )
    return load_target(name).name


def canonical_node_key(line: str, where: str = "") -> str:
    """The canonical OpenSSH line of an EC P-384 public key ("ecdsa-sha2-nistp384 AAAA...", no
    comment): the one form keys are compared and stored in.

    Raises:
        ConfigError: not ASCII, or not such a key (see :func:`node_public_key`).
    """
    key = node_public_key(line, where)
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode("ascii")


def node_public_key(line: str, where: str = "") -> ec.EllipticCurvePublicKey:
    """An OpenSSH EC P-384 public key line (what Flower 1.42 authenticates SuperNodes with).

    Raises:
        ConfigError: a non-ASCII character anywhere in it, or anything but such a key.
    """
    if not line.isascii():
        at = next(i for i, c in enumerate(line) if not c.isascii())
        raise ConfigError(
            f"{_at(where)}node_public_key holds a non-ASCII character ({line[at]!r} at {at}); an "
            "OpenSSH key line is ASCII: copy it exactly as `cuvil-edge agent init` wrote it"
        )
    try:
        key = serialization.load_ssh_public_key(line.strip().encode("ascii"))
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ConfigError(f"{_at(where)}node_public_key is not an OpenSSH public key ({e})") from e
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise ConfigError(f"{_at(where)}node_public_key must be an EC P-384 key (ecdsa-sha2-nistp384)")
    return key


def _at(where: str) -> str:
    return f"{where}: " if where else ""
