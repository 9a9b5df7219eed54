"""The signed package file (PACKAGE_SPEC §2) and its writer.

    prelude (20 B) | envelope (canonical JSON, <= 64 KiB) | zero padding to 64 | payload

The envelope holds the release statement's and the manifest's DSSE envelopes and
an optional chain of newer trust roots.  The payload is the IR container, or
the container sealed for the site (§9).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from cuvil_edge.errors import (
    DeclaredLengthError,
    PackageFormatError,
    PackageSizeError,
    RegionLayoutError,
    TruncatedPackageError,
    UnsupportedFormatError,
)
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize._canonical import canonical_json, fields, get_list, parse_json
from cuvil_edge.ir_serialize.container import align, byte_view, encode_payload, read_layout
from cuvil_edge.ir_serialize.dsse import Envelope, parse_envelope, sign_envelope
from cuvil_edge.ir_serialize.manifest import (
    MANIFEST_TYPE,
    RELEASE_TYPE,
    Manifest,
    Region,
    ReleaseStatement,
    Sealed,
    check_fields,
)
from cuvil_edge.ir_serialize.sealing import hpke_info, seal, seal_key_id
from cuvil_edge.ir_serialize.trust import MAX_ROOT_CHAIN

MAGIC = b"CUVLSPK\0"
PACKAGE_VERSION = 2
#: magic, package version, envelope length, reserved (0).
PRELUDE = struct.Struct("<8sIII")
MAX_ENVELOPE_BYTES = 64 * 1024  # PACKAGE_SPEC §8
ENVELOPE_KEYS = ("manifest", "release", "roots")
Keys = Ed25519PrivateKey | Sequence[Ed25519PrivateKey]


@dataclass(frozen=True)
class PackageParts:
    """The pieces located by :func:`_split_package`; nothing in them is verified yet."""

    manifest: Envelope
    release: Envelope
    roots: tuple[Any, ...]
    payload: memoryview
    size: int


@dataclass(frozen=True)
class SignedRelease:
    """A release statement and its release-role envelope."""

    statement: ReleaseStatement
    envelope: Envelope

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.envelope.body).hexdigest()


def _keys(keys: Keys) -> list[Ed25519PrivateKey]:
    return [keys] if isinstance(keys, Ed25519PrivateKey) else list(keys)


def payload_regions(payload: bytes) -> tuple[Region, ...]:
    """The header and tensor regions of a container we wrote (PACKAGE_SPEC §3.3)."""
    view = byte_view(payload)
    layout = read_layout(view)
    head = Region("header", "", 0, layout.data_start, hashlib.sha256(view[: layout.data_start]).hexdigest())
    return (head,) + tuple(
        Region("tensor", e.name, layout.data_start + e.offset, e.length, e.sha256) for e in layout.entries
    )


def sign_release(
    payload: bytes, package: str, release_counter: int, targets: Iterable[str], keys: Keys
) -> SignedRelease:
    """The release statement for ``payload`` signed by the release-role ``keys`` (§3.1).

    Raises:
        PackageFormatError: a name or field is invalid.
    """
    statement = ReleaseStatement(package, release_counter, tuple(sorted(set(targets))), payload_regions(payload))
    body = statement.to_bytes()
    ReleaseStatement.from_bytes(body)  # the writer applies the reader's checks
    return SignedRelease(statement, sign_envelope(RELEASE_TYPE, body, _keys(keys)))


def write_package(
    graph: Graph | None,
    site: str,
    target: str,
    version: int,
    signing_key: Keys,
    *,
    issued_at: int,
    expires: int,
    release: SignedRelease | None = None,
    release_key: Keys | None = None,
    payload: bytes | None = None,
    package: str = "model",
    release_counter: int = 1,
    nonce: str | None = None,
    seal_to: X25519PublicKey | None = None,
    roots: Sequence[Any] = (),
) -> bytes:
    """Encode ``graph`` (or take ``payload``), bind it in a manifest for ``site``/``target``, sign it.

    ``release`` is a statement signed earlier (offline); otherwise ``release_key`` signs one here
    for ``package``/``release_counter``/``[target]``.  ``seal_to`` seals the payload for the
    site's X25519 key (§9); ``roots`` are newer root.json envelopes for the agent (§10.3).

    Raises:
        PackageFormatError: the graph cannot be serialized or a field is invalid.
        PackageSizeError: the envelope is over 64 KiB.
    """
    if payload is None and graph is None:
        raise PackageFormatError("write_package needs the graph or its encoded payload")
    plain = payload if payload is not None else encode_payload(graph)  # type: ignore[arg-type]  # checked above
    if release is None:
        if release_key is None:
            raise PackageFormatError("write_package needs a signed release statement or the release key")
        release = sign_release(plain, package, release_counter, [target], release_key)
    st = release.statement
    sealed = None
    if seal_to is not None:
        from cuvil_edge.ir_serialize.sealing import sealed_length

        sealed = Sealed(seal_key_id(seal_to), sealed_length(len(plain)))
    manifest = check_fields(
        Manifest(
            st.package,
            site,
            target,
            version,
            issued_at,
            expires,
            nonce,
            release.digest,
            len(plain),
            sealed,
            payload_regions(plain),
        )
    )
    body = manifest.to_bytes()
    envelope = sign_envelope(MANIFEST_TYPE, body, _keys(signing_key))
    if seal_to is not None:
        plain = seal(plain, seal_to, info=hpke_info(site, st.package, version), aad=hashlib.sha256(body).digest())
    return assemble(envelope, release.envelope, plain, roots)


def assemble(manifest: Envelope, release: Envelope, payload: bytes, roots: Sequence[Any] = ()) -> bytes:
    """Lay out a package from its parts (§2.1); no checks on their contents.

    Raises:
        PackageSizeError: the envelope is over its cap.
    """
    env = canonical_json(
        {"manifest": manifest.to_dict(), "release": release.to_dict(), "roots": list(roots)}, "package envelope"
    )
    if len(env) > MAX_ENVELOPE_BYTES:
        raise PackageSizeError(f"the envelope is {len(env)} bytes, over the {MAX_ENVELOPE_BYTES}-byte cap")
    head = PRELUDE.pack(MAGIC, PACKAGE_VERSION, len(env), 0) + env
    return head + bytes(align(len(head)) - len(head)) + bytes(payload)


def _split_package(view: memoryview, max_package_bytes: int) -> PackageParts:
    """Steps 1-2 of verification (PACKAGE_SPEC §7): sizes, the fixed layout, envelope structure.

    Raises:
        PackageSizeError (DeclaredLengthError, TruncatedPackageError): a size is over its cap or past the end.
        PackageFormatError (UnsupportedFormatError, RegionLayoutError, ...): bad magic or version,
            malformed envelope JSON, non-zero padding.
    """
    size = len(view)
    if size > max_package_bytes:
        raise PackageSizeError(f"the package is {size} bytes, over this agent's limit of {max_package_bytes}")
    if size < PRELUDE.size:
        raise TruncatedPackageError(f"the package is {size} bytes, shorter than its {PRELUDE.size}-byte prelude")
    magic, version, env_len, reserved = PRELUDE.unpack_from(view, 0)
    if magic != MAGIC:
        raise PackageFormatError(f"not a cuvil package: magic is {bytes(magic)!r}, expected {MAGIC!r}")
    if version != PACKAGE_VERSION:
        raise UnsupportedFormatError(f"package version {version} is not supported (this reader: {PACKAGE_VERSION})")
    if reserved != 0:
        raise PackageFormatError("the package prelude's reserved field must be 0")
    if env_len > MAX_ENVELOPE_BYTES:
        raise DeclaredLengthError(f"the envelope declares {env_len} bytes, over the {MAX_ENVELOPE_BYTES}-byte cap")
    env_end = PRELUDE.size + env_len
    payload_start = align(env_end)
    if payload_start > size:
        raise TruncatedPackageError(f"the package is {size} bytes but its envelope needs {payload_start}")
    if any(view[env_end:payload_start]):
        raise RegionLayoutError("the padding after the envelope is not all zero")
    doc = fields(parse_json(view[PRELUDE.size : env_end], "package envelope"), ENVELOPE_KEYS, "package envelope")
    roots = get_list(doc, "roots", "package envelope")
    if len(roots) > MAX_ROOT_CHAIN:
        from cuvil_edge.errors import RootChainTooLongError

        raise RootChainTooLongError(f"the package carries {len(roots)} root updates; at most {MAX_ROOT_CHAIN}")
    return PackageParts(
        manifest=parse_envelope(doc["manifest"], MANIFEST_TYPE, MAX_ENVELOPE_BYTES, "manifest envelope"),
        release=parse_envelope(doc["release"], RELEASE_TYPE, MAX_ENVELOPE_BYTES, "release envelope"),
        roots=tuple(roots),
        payload=view[payload_start:],
        size=size,
    )
