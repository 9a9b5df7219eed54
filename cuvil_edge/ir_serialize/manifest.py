"""The per-site manifest (PACKAGE_SPEC §3): what the coordinator signs for one site."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cuvil_edge.errors import PackageFormatError
from cuvil_edge.ir_serialize._canonical import canonical_json, check_int, check_str, fields, parse_json

MANIFEST_FORMAT = 1
MAX_NAME_CHARS = 256
_KEYS = ("format", "site", "target", "version", "issued_at", "expires", "payload_sha256", "payload_length")


@dataclass(frozen=True)
class Manifest:
    """Addressing, freshness and payload binding of one package (PACKAGE_SPEC §3.1).

    Times are integer Unix seconds.  The package is valid while
    ``issued_at <= now < expires`` (with a small clock skew allowed on ``issued_at``).

    Raises:
        PackageFormatError: (on construction) a field has the wrong type or range.
    """

    site: str
    target: str
    version: int
    issued_at: int
    expires: int
    payload_sha256: str
    payload_length: int
    format: int = MANIFEST_FORMAT

    def __post_init__(self) -> None:
        check_str(self.site, "manifest field 'site'", max_len=MAX_NAME_CHARS)
        check_str(self.target, "manifest field 'target'", max_len=MAX_NAME_CHARS)
        for key in ("version", "issued_at", "expires", "payload_length", "format"):
            check_int(getattr(self, key), f"manifest field {key!r}")
        if self.format != MANIFEST_FORMAT:
            raise PackageFormatError(f"manifest format {self.format} is not supported (this reader: {MANIFEST_FORMAT})")
        if self.expires <= self.issued_at:
            raise PackageFormatError(f"manifest expires ({self.expires}) is not after issued_at ({self.issued_at})")
        digest = self.payload_sha256
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise PackageFormatError("manifest field 'payload_sha256' must be 64 lowercase hex digits")

    def to_dict(self) -> dict[str, Any]:
        """The manifest as a JSON object (every field, always)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any) -> "Manifest":
        """Strict inverse of :meth:`to_dict`.

        Raises:
            PackageFormatError: missing, unknown or mistyped fields (bool is not an int).
        """
        return cls(**fields(obj, _KEYS, "manifest"))

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes (PACKAGE_SPEC §1.2): exactly what gets signed."""
        return canonical_json(self.to_dict(), "manifest")

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        """Parse manifest bytes strictly (canonical form, no duplicate keys, no NaN).

        Raises:
            PackageFormatError: the bytes are not a canonical, well-formed manifest.
        """
        return cls.from_dict(parse_json(data, "manifest"))
