"""Package verification without IO, in the fixed order of PACKAGE_SPEC §7.

``verify_package`` is a pure function of the bytes, the pinned key, the site's
identity, the time and the last accepted version.  Recording the accepted
version is the caller's job (:class:`~cuvil_edge.ir_serialize.state.AntiRollbackState`),
after whatever else must succeed first.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import mmap
import os
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cuvil_edge.errors import (
    ExpiredPackageError,
    PackageError,
    PackageSizeError,
    PayloadDigestError,
    RollbackError,
    WrongSiteError,
    WrongTargetError,
)
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize.container import Buffer, byte_view, decode_payload
from cuvil_edge.ir_serialize.manifest import Manifest
from cuvil_edge.ir_serialize.package import split_package
from cuvil_edge.ir_serialize.signing import verify_manifest_signature

log = logging.getLogger(__name__)

#: How far ``issued_at`` may lie in the agent's future (clock skew), PACKAGE_SPEC §7 step 6.
DEFAULT_CLOCK_SKEW_S = 300


@dataclass(frozen=True)
class VerifiedPackage:
    """A package that passed every check; ``graph`` initializers view the package buffer."""

    manifest: Manifest
    graph: Graph
    payload_digest: str
    size: int


def verify_package(
    data: Buffer,
    *,
    public_key: Ed25519PublicKey,
    site: str,
    target: str,
    now: int,
    last_version: int | None,
    max_package_bytes: int,
    clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
) -> VerifiedPackage:
    """Check a package in the order of PACKAGE_SPEC §7 and decode its graph.

    Raises:
        PackageSizeError: step 1, a size limit is exceeded or the envelope is truncated.
        PackageFormatError: step 1 or 3 or 9, the bytes do not follow PACKAGE_SPEC.
        SignatureError: step 2, the manifest is not signed by ``public_key``.
        WrongSiteError: step 4, the manifest names another site.
        WrongTargetError: step 5, the manifest names another target.
        ExpiredPackageError: step 6, expired, or issued in the future beyond ``clock_skew_s``.
        RollbackError: step 7, version not strictly greater than ``last_version``.
        PayloadDigestError: step 8 (or 9 for a tensor), payload length or sha256 differs.
    """
    parts = split_package(byte_view(data), max_package_bytes)
    verify_manifest_signature(parts.manifest_bytes, parts.signature, public_key)
    manifest = Manifest.from_bytes(parts.manifest_bytes)
    _check_addressing(manifest, site, target)
    _check_time(manifest, now, clock_skew_s)
    _check_version(manifest, last_version)
    digest = _check_payload(manifest, parts.payload)
    graph = decode_payload(parts.payload)
    return VerifiedPackage(manifest=manifest, graph=graph, payload_digest=digest, size=parts.size)


def _check_addressing(manifest: Manifest, site: str, target: str) -> None:
    if manifest.site != site:
        raise WrongSiteError(f"the package is addressed to site {manifest.site!r}, this agent is site {site!r}")
    if manifest.target != target:
        raise WrongTargetError(f"the package is built for target {manifest.target!r}, this device is {target!r}")


def _check_time(manifest: Manifest, now: int, clock_skew_s: int) -> None:
    if now >= manifest.expires:
        raise ExpiredPackageError(
            f"package version {manifest.version} expired at {manifest.expires} (now {now}); ask the coordinator for a fresh one"
        )
    if manifest.issued_at > now + clock_skew_s:
        raise ExpiredPackageError(
            f"package version {manifest.version} is issued at {manifest.issued_at}, {manifest.issued_at - now} s in the "
            f"future (skew allowed {clock_skew_s} s); check this device's clock"
        )


def _check_version(manifest: Manifest, last_version: int | None) -> None:
    if last_version is not None and manifest.version <= last_version:
        raise RollbackError(
            f"package version {manifest.version} is not newer than the last accepted version {last_version}; "
            "refusing a rollback or replay"
        )


def _check_payload(manifest: Manifest, payload: memoryview) -> str:
    if len(payload) != manifest.payload_length:
        raise PayloadDigestError(
            f"the payload is {len(payload)} bytes, the signed manifest says {manifest.payload_length}; truncated or padded"
        )
    digest = hashlib.sha256(payload).hexdigest()
    if not hmac.compare_digest(digest, manifest.payload_sha256):
        raise PayloadDigestError("the payload's sha256 differs from the signed manifest; the payload was altered")
    return digest


def open_package(
    path: str | os.PathLike,
    *,
    public_key: Ed25519PublicKey,
    site: str,
    target: str,
    now: int,
    last_version: int | None,
    max_package_bytes: int,
    clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
) -> VerifiedPackage:
    """Map ``path`` read-only and :func:`verify_package` it; tensors view the map (no copies).

    The map stays open as long as any initializer of the returned graph is alive.

    Raises:
        PackageError: the file cannot be opened or mapped.
        PackageSizeError, ...: everything :func:`verify_package` raises.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_package_bytes:
                raise PackageSizeError(f"package file {path} is {size} bytes, over this agent's limit of {max_package_bytes}")
            if size == 0:
                raise PackageSizeError(f"package file {path} is empty")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise PackageError(f"cannot map package file {path}: {e}") from e
    try:
        return verify_package(mapped, public_key=public_key, site=site, target=target, now=now,
                              last_version=last_version, max_package_bytes=max_package_bytes, clock_skew_s=clock_skew_s)
    except BaseException:
        _close_quietly(mapped)
        raise


def _close_quietly(mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:
        log.debug("package map still referenced after a failed verification; left to the garbage collector")
