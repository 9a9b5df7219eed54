"""The enrollment file: the public material a device hands its coordinator (shared by both sides).

``cuvil-edge agent init`` writes it on the device; ``cuvil-edge coordinator enroll`` reads it.
It holds only public keys::

    {"format": 1, "site": "hospital-a", "target": "jetson-orin-nano",
     "node_public_key": "ecdsa-sha2-nistp384 AAAA...",   # Flower node authentication (OpenSSH)
     "seal_public_key": "<64 hex>"}                       # X25519, packages are sealed for it
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cuvil_edge.config.site import SITE_ID_PATTERN
from cuvil_edge.errors import ConfigError

ENROLLMENT_FORMAT = 1
_FIELDS = ("format", "site", "target", "node_public_key", "seal_public_key")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
MAX_BYTES = 16 * 1024


@dataclass(frozen=True)
class Enrollment:
    site: str
    target: str
    node_public_key: str
    seal_public_key: str

    def to_json(self) -> str:
        return json.dumps({"format": ENROLLMENT_FORMAT, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str, where: str) -> "Enrollment":
        """Strict parse; every field is checked.

        Raises:
            ConfigError: not JSON, unknown or missing fields, a bad site id, or keys of the wrong kind.
        """
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{where}: not an enrollment file (invalid JSON: {e})") from e
        if not isinstance(doc, dict) or sorted(doc) != sorted(_FIELDS):
            raise ConfigError(f"{where}: an enrollment file has exactly the fields {list(_FIELDS)}")
        if doc["format"] != ENROLLMENT_FORMAT:
            raise ConfigError(f"{where}: enrollment format {doc['format']!r} is not supported (this reader: 1)")
        if not all(isinstance(doc[k], str) for k in _FIELDS[1:]):
            raise ConfigError(f"{where}: site, target and keys must be strings")
        if not re.match(SITE_ID_PATTERN, doc["site"]):
            raise ConfigError(f"{where}: site id {doc['site']!r:.80} must match {SITE_ID_PATTERN}")
        node_public_key(doc["node_public_key"], where)
        if not _HEX64.match(doc["seal_public_key"]):
            raise ConfigError(f"{where}: seal_public_key must be 64 lowercase hex digits (X25519)")
        return Enrollment(doc["site"], doc["target"], doc["node_public_key"], doc["seal_public_key"])

    @staticmethod
    def read(path: Path) -> "Enrollment":
        """Raises: ConfigError: unreadable, too large or malformed."""
        try:
            data = Path(path).read_bytes()[:MAX_BYTES + 1]
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the enrollment file ({e.strerror})") from e
        if len(data) > MAX_BYTES:
            raise ConfigError(f"{path}: over {MAX_BYTES} bytes; not an enrollment file")
        return Enrollment.from_json(data.decode("utf-8", errors="replace"), str(path))


def node_public_key(line: str, where: str) -> ec.EllipticCurvePublicKey:
    """An OpenSSH EC P-384 public key line (what Flower 1.42 authenticates SuperNodes with).

    Raises:
        ConfigError: anything else.
    """
    try:
        key = serialization.load_ssh_public_key(line.strip().encode("ascii"))
    except (ValueError, UnicodeEncodeError) as e:
        raise ConfigError(f"{where}: node_public_key is not an OpenSSH public key ({e})") from e
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise ConfigError(f"{where}: node_public_key must be an EC P-384 key (ecdsa-sha2-nistp384)")
    return key
