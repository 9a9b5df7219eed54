"""The signed package file (PACKAGE_SPEC §2): prelude, manifest, signature, padding, payload."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cuvil_edge.errors import PackageFormatError, PackageSizeError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize.container import align, encode_payload
from cuvil_edge.ir_serialize.manifest import Manifest
from cuvil_edge.ir_serialize.signing import SIGNATURE_BYTES, sign_manifest

MAGIC = b"CUVLSPK\0"
PACKAGE_VERSION = 1
#: magic, package version, manifest length, signature length.
PRELUDE = struct.Struct("<8sIII")
MAX_MANIFEST_BYTES = 64 * 1024  # PACKAGE_SPEC §8


@dataclass(frozen=True)
class PackageParts:
    """The pieces of a package located by :func:`split_package`; nothing in them is trusted yet."""

    manifest_bytes: bytes
    signature: bytes
    payload: memoryview
    size: int


def write_package(
    graph: Graph,
    site: str,
    target: str,
    version: int,
    signing_key: Ed25519PrivateKey,
    *,
    issued_at: int,
    expires: int,
) -> bytes:
    """Encode ``graph``, bind it in a manifest for ``site``/``target`` and sign it.

    Raises:
        PackageFormatError: the graph cannot be serialized or a manifest field is invalid.
    """
    payload = encode_payload(graph)
    manifest = Manifest(site=site, target=target, version=version, issued_at=issued_at, expires=expires,
                        payload_sha256=hashlib.sha256(payload).hexdigest(), payload_length=len(payload))
    manifest_bytes = manifest.to_bytes()
    return assemble(manifest_bytes, sign_manifest(manifest_bytes, signing_key), payload)


def assemble(manifest_bytes: bytes, signature: bytes, payload: bytes) -> bytes:
    """Lay out a package from its parts (PACKAGE_SPEC §2.1); no checks on their contents.

    Raises:
        PackageSizeError: the manifest is over its cap.
    """
    if len(manifest_bytes) > MAX_MANIFEST_BYTES:
        raise PackageSizeError(f"the manifest is {len(manifest_bytes)} bytes, over the {MAX_MANIFEST_BYTES}-byte cap")
    envelope = PRELUDE.pack(MAGIC, PACKAGE_VERSION, len(manifest_bytes), len(signature)) + manifest_bytes + signature
    return envelope + bytes(align(len(envelope)) - len(envelope)) + payload


def split_package(view: memoryview, max_package_bytes: int) -> PackageParts:
    """Step 1 of verification (PACKAGE_SPEC §7): size limits and the fixed layout, nothing else.

    Raises:
        PackageSizeError: over ``max_package_bytes``, manifest over 64 KiB, or parts past the end.
        PackageFormatError: bad magic or version, signature not 64 bytes, non-zero padding.
    """
    size = len(view)
    if size > max_package_bytes:
        raise PackageSizeError(f"the package is {size} bytes, over this agent's limit of {max_package_bytes}")
    if size < PRELUDE.size:
        raise PackageSizeError(f"the package is {size} bytes, shorter than its {PRELUDE.size}-byte prelude; truncated?")
    magic, version, manifest_len, sig_len = PRELUDE.unpack_from(view, 0)
    if magic != MAGIC:
        raise PackageFormatError(f"not a cuvil package: magic is {magic!r}, expected {MAGIC!r}")
    if version != PACKAGE_VERSION:
        raise PackageFormatError(f"package version {version} is not supported (this reader: {PACKAGE_VERSION})")
    if manifest_len > MAX_MANIFEST_BYTES:
        raise PackageSizeError(f"the manifest declares {manifest_len} bytes, over the {MAX_MANIFEST_BYTES}-byte cap")
    if sig_len != SIGNATURE_BYTES:
        raise PackageFormatError(f"the signature is declared as {sig_len} bytes; an Ed25519 signature is {SIGNATURE_BYTES}")
    envelope_end = PRELUDE.size + manifest_len + sig_len
    payload_start = align(envelope_end)
    if payload_start > size:
        raise PackageSizeError(f"the package is {size} bytes but its envelope needs {payload_start}; truncated?")
    if any(view[envelope_end:payload_start]):
        raise PackageFormatError("the padding after the signature is not all zero")
    return PackageParts(
        manifest_bytes=bytes(view[PRELUDE.size:PRELUDE.size + manifest_len]),
        signature=bytes(view[PRELUDE.size + manifest_len:envelope_end]),
        payload=view[payload_start:],
        size=size,
    )
