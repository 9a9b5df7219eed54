"""The two signed statements (PACKAGE_SPEC §3): the release statement (release role) and the
per-site manifest (coordinator role), and the region lists they both carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuvil_edge.errors import BadNameError, PackageFormatError, UnsupportedFormatError
from cuvil_edge.ir_serialize._canonical import (
    canonical_json,
    check_int,
    check_name,
    check_str,
    check_tensor_name,
    fields,
    get_int,
    get_list,
    hex_digest,
    parse_json,
)

MANIFEST_FORMAT = 2
RELEASE_FORMAT = 1
MANIFEST_TYPE = "application/vnd.cuvil.manifest.v2+json"
RELEASE_TYPE = "application/vnd.cuvil.release.v1+json"
MAX_REGIONS = 4096
MAX_TARGETS = 64
MAX_NONCE_CHARS = 128
REGION_KINDS = ("header", "tensor")
_MANIFEST_KEYS = (
    "format",
    "package",
    "site",
    "target",
    "version",
    "issued_at",
    "expires",
    "nonce",
    "release_sha256",
    "payload_length",
    "sealed",
    "regions",
)
_RELEASE_KEYS = ("format", "package", "release_counter", "targets", "regions")


@dataclass(frozen=True)
class Region:
    """One byte region of the plaintext payload (§3.3): the container header or one tensor."""

    kind: str
    name: str
    offset: int
    length: int
    sha256: str

    def to_dict(self, with_offset: bool = True) -> dict[str, Any]:
        d = {"kind": self.kind, "name": self.name, "length": self.length, "sha256": self.sha256}
        return {**d, "offset": self.offset} if with_offset else d

    @staticmethod
    def from_dict(obj: Any, where: str, with_offset: bool = True) -> Region:
        keys = ("kind", "name", "length", "sha256") + (("offset",) if with_offset else ())
        r = fields(obj, keys, where)
        kind = check_str(r["kind"], f"{where} kind")
        if kind not in REGION_KINDS:
            raise UnsupportedFormatError(f"{where} has unknown region kind {kind!r:.40}")
        if kind == "header" and r["name"] != "":
            raise BadNameError(f"{where}: the header region's name must be empty (PACKAGE_SPEC §3.3)")
        name = check_tensor_name(r["name"], f"{where} name") if kind == "tensor" else ""
        return Region(
            kind,
            name,
            get_int(r, "offset", where) if with_offset else 0,
            get_int(r, "length", where),
            hex_digest(r["sha256"], f"{where} sha256"),
        )


def _regions(obj: Any, key: str, where: str, with_offset: bool) -> tuple[Region, ...]:
    rows = get_list(obj, key, where)
    if not 1 <= len(rows) <= MAX_REGIONS:
        raise PackageFormatError(f"{where} must list 1..{MAX_REGIONS} regions, lists {len(rows)}")
    regions = tuple(Region.from_dict(r, f"{where} region #{i}", with_offset) for i, r in enumerate(rows))
    if regions[0].kind != "header" or any(r.kind != "tensor" for r in regions[1:]):
        raise PackageFormatError(f"{where}: the first region must be the header, all others tensors")
    return regions


@dataclass(frozen=True)
class ReleaseStatement:
    """What the release role approves (§3.1): content, counter and target kinds, for every site."""

    package: str
    release_counter: int
    targets: tuple[str, ...]
    regions: tuple[Region, ...]
    format: int = RELEASE_FORMAT

    def to_bytes(self) -> bytes:
        return canonical_json(
            {
                "format": self.format,
                "package": self.package,
                "release_counter": self.release_counter,
                "targets": list(self.targets),
                "regions": [r.to_dict(with_offset=False) for r in self.regions],
            },
            "release statement",
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ReleaseStatement:
        """Strict parse (§1.2, §3.1).

        Raises:
            PackageFormatError (and leaf types): malformed, unknown fields or version, bad names.
        """
        d = fields(parse_json(data, "release statement"), _RELEASE_KEYS, "release statement")
        if get_int(d, "format", "release statement") != RELEASE_FORMAT:
            raise UnsupportedFormatError(f"release statement format {d['format']} is not supported")
        targets = tuple(check_name(t, "release target") for t in get_list(d, "targets", "release statement"))
        if not 1 <= len(targets) <= MAX_TARGETS or list(targets) != sorted(set(targets)):
            raise PackageFormatError(f"release targets must be 1..{MAX_TARGETS} names, sorted, without duplicates")
        return cls(
            check_name(d["package"], "release package name"),
            get_int(d, "release_counter", "release statement"),
            targets,
            _regions(d, "regions", "release statement", with_offset=False),
        )


@dataclass(frozen=True)
class Sealed:
    """Sealing parameters (§9): recipient key id (sha256 of the raw X25519 key) and sealed length."""

    recipient: str
    length: int


@dataclass(frozen=True)
class Manifest:
    """What the coordinator signs for one site (§3.2)."""

    package: str
    site: str
    target: str
    version: int
    issued_at: int
    expires: int
    nonce: str | None
    release_sha256: str
    payload_length: int
    sealed: Sealed | None
    regions: tuple[Region, ...]
    format: int = MANIFEST_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "package": self.package,
            "site": self.site,
            "target": self.target,
            "version": self.version,
            "issued_at": self.issued_at,
            "expires": self.expires,
            "nonce": self.nonce,
            "release_sha256": self.release_sha256,
            "payload_length": self.payload_length,
            "sealed": None
            if self.sealed is None
            else {"recipient": self.sealed.recipient, "length": self.sealed.length},
            "regions": [r.to_dict() for r in self.regions],
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_dict(), "manifest")

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Strict parse (§1.2, §3.2).

        Raises:
            PackageFormatError (and leaf types): malformed, unknown fields or version, bad names.
        """
        d = fields(parse_json(data, "manifest"), _MANIFEST_KEYS, "manifest")
        if get_int(d, "format", "manifest") != MANIFEST_FORMAT:
            raise UnsupportedFormatError(
                f"manifest format {d['format']} is not supported (this reader: {MANIFEST_FORMAT})"
            )
        nonce = d["nonce"]
        if nonce is not None:
            check_str(nonce, "manifest nonce", max_len=MAX_NONCE_CHARS)
        sealed = d["sealed"]
        if sealed is not None:
            s = fields(sealed, ("recipient", "length"), "manifest sealed")
            sealed = Sealed(hex_digest(s["recipient"], "sealed recipient"), get_int(s, "length", "manifest sealed"))
        issued, expires = get_int(d, "issued_at", "manifest"), get_int(d, "expires", "manifest")
        if expires <= issued:
            raise PackageFormatError(f"manifest expires ({expires}) is not after issued_at ({issued})")
        return cls(
            check_name(d["package"], "manifest package"),
            check_name(d["site"], "manifest site"),
            check_name(d["target"], "manifest target"),
            get_int(d, "version", "manifest"),
            issued,
            expires,
            nonce,
            hex_digest(d["release_sha256"], "manifest release_sha256"),
            get_int(d, "payload_length", "manifest"),
            sealed,
            _regions(d, "regions", "manifest", True),
        )


def check_fields(m: Manifest) -> Manifest:
    """Writer-side validation: round-trip through the strict reader.

    Raises:
        PackageFormatError: a field is invalid.
    """
    for key in ("version", "issued_at", "expires", "payload_length"):
        check_int(getattr(m, key), f"manifest field {key!r}")
    return Manifest.from_bytes(m.to_bytes())
