"""Package verification without IO, in the fixed order of PACKAGE_SPEC §7.

``verify_package`` is a pure function of the bytes, the trusted root, the site's
identity and keys, the time and a snapshot of the anti-rollback state.  Recording
the acceptance is the caller's job (:meth:`AntiRollbackState.accept`), before use.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import mmap
import os
from dataclasses import dataclass
from typing import Any, Optional

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cuvil_edge.errors import (
    ClockRollbackError, DeclaredLengthError, DigestConflictError, ExpiredPackageError, ManifestMismatchError,
    NonceError, PackageError, PackageSizeError, RegionDigestError, RegionLayoutError, ReleaseRollbackError,
    RollbackError, TrailingDataError, TruncatedPackageError, WrongSealKeyError, WrongSiteError, WrongTargetError,
)
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize._canonical import canonical_json
from cuvil_edge.ir_serialize.container import Buffer, align, byte_view, decode_payload, read_layout
from cuvil_edge.ir_serialize.manifest import Manifest, Region, ReleaseStatement
from cuvil_edge.ir_serialize.package import split_package
from cuvil_edge.ir_serialize.sealing import hpke_info, seal_key_id, unseal
from cuvil_edge.ir_serialize.state import RollbackSnapshot
from cuvil_edge.ir_serialize.trust import TrustRoot, apply_root_chain

log = logging.getLogger(__name__)

#: How far ``issued_at`` may lie in the agent's future (clock skew), PACKAGE_SPEC §7 step 7.
DEFAULT_CLOCK_SKEW_S = 300


@dataclass(frozen=True)
class VerifiedPackage:
    """A package that passed every check; plaintext ``graph`` initializers view the package buffer."""

    manifest: Manifest
    release: ReleaseStatement
    graph: Graph
    payload_digest: str  # sha256 of the canonical region list: identifies the plaintext payload
    manifest_digest: str
    root: TrustRoot
    root_envelope: Any  # the newest root envelope applied from the package, or None
    size: int


def verify_package(data: Buffer, *, trust_root: TrustRoot, site: str, target: str, now: int,
                   max_package_bytes: int, state: Optional[RollbackSnapshot] = None,
                   clock_skew_s: int = DEFAULT_CLOCK_SKEW_S, seal_key: Optional[X25519PrivateKey] = None,
                   expected_nonce: Optional[str] = None) -> VerifiedPackage:
    """Check a package in the order of PACKAGE_SPEC §7 and decode its graph.

    Raises:
        PackageError: the first failing step's leaf type (table in PACKAGE_SPEC §7).
    """
    state = state or RollbackSnapshot()
    parts = split_package(byte_view(data), max_package_bytes)                       # 1-2
    root = apply_root_chain(trust_root, parts.roots, now) if parts.roots else trust_root  # 3
    if not parts.roots and now >= root.expires:
        from cuvil_edge.errors import ExpiredRootError

        raise ExpiredRootError(f"trust root v{root.version} expired at {root.expires}; the federation must publish a new one")
    root.verify(parts.release, "release")                                          # 4
    root.verify(parts.manifest, "coordinator")
    release = ReleaseStatement.from_bytes(parts.release.body)                      # 5
    manifest = Manifest.from_bytes(parts.manifest.body)
    _check_agreement(manifest, release, parts.release.body)                        # 6
    _check_addressing(manifest, site, target, expected_nonce)                      # 7
    _check_time(manifest, now, state.time_floor, clock_skew_s)
    manifest_digest = hashlib.sha256(parts.manifest.body).hexdigest()
    _check_versions(manifest, release, manifest_digest, state)                     # 8
    plain = _open_payload(parts.payload, manifest, parts.manifest.body, seal_key, max_package_bytes)  # 9
    _check_regions(plain, manifest)                                                # 10
    graph = decode_payload(plain, check_digests=False)                             # 11 (digests checked in 10)
    newest = parts.roots[-1] if parts.roots and root.version > trust_root.version else None
    return VerifiedPackage(manifest, release, graph, _content_digest(manifest), manifest_digest, root, newest,
                           parts.size)


def _content_digest(manifest: Manifest) -> str:
    rows = [r.to_dict() for r in manifest.regions]
    return hashlib.sha256(canonical_json([manifest.payload_length, rows], "regions")).hexdigest()


def _check_agreement(m: Manifest, r: ReleaseStatement, release_body: bytes) -> None:
    """Uptane full verification (§6): the manifest names this release and agrees with it."""
    if not hmac.compare_digest(hashlib.sha256(release_body).hexdigest(), m.release_sha256):
        raise ManifestMismatchError("the manifest references another release statement (mix-and-match)")
    if m.package != r.package:
        raise ManifestMismatchError(f"manifest package {m.package!r} differs from the release's {r.package!r}")
    if m.target not in r.targets:
        raise WrongTargetError(f"release {r.package!r} is not approved for target {m.target!r} (only {list(r.targets)})")
    mine = [x.to_dict(with_offset=False) for x in m.regions]
    if mine != [x.to_dict(with_offset=False) for x in r.regions]:
        raise ManifestMismatchError("the manifest's regions differ from the release statement's (a region was "
                                    "replaced, deleted, added or swapped)")


def _check_addressing(m: Manifest, site: str, target: str, expected_nonce: Optional[str]) -> None:
    if m.site != site:
        raise WrongSiteError(f"the package is addressed to site {m.site!r}, this agent is site {site!r}")
    if m.target != target:
        raise WrongTargetError(f"the package is built for target {m.target!r}, this device is {target!r}")
    if expected_nonce is not None and (m.nonce is None or not hmac.compare_digest(m.nonce.encode("utf-8"), expected_nonce.encode("utf-8"))):
        raise NonceError("the manifest does not carry this agent's current nonce; a replayed or stale package")


def _check_time(m: Manifest, now: int, time_floor: int, clock_skew_s: int) -> None:
    if now >= m.expires:
        raise ExpiredPackageError(f"package version {m.version} expired at {m.expires} (now {now})")
    if time_floor >= m.expires:
        raise ClockRollbackError(f"package version {m.version} expired at {m.expires}, before the latest issue time "
                                 f"this agent has seen ({time_floor}); this device's clock is set back")
    if m.issued_at > max(now, time_floor) + clock_skew_s:
        raise ExpiredPackageError(f"package version {m.version} is issued at {m.issued_at}, in the future beyond the "
                                  f"{clock_skew_s} s skew; check this device's clock")


def _check_versions(m: Manifest, r: ReleaseStatement, digest: str, state: RollbackSnapshot) -> None:
    prev = state.sites.get(m.site)
    if prev is not None and m.version < prev.version:
        raise RollbackError(f"package version {m.version} is older than the accepted {prev.version}")
    if prev is not None and m.version == prev.version and not hmac.compare_digest(digest, prev.digest):
        raise DigestConflictError(f"package version {m.version} was already accepted with another manifest")
    if r.release_counter < state.releases.get(r.package, 0):
        raise ReleaseRollbackError(f"release {r.package!r} counter {r.release_counter} is below the accepted "
                                   f"{state.releases[r.package]}")


def _open_payload(payload: memoryview, m: Manifest, manifest_body: bytes, seal_key: Optional[X25519PrivateKey],
                  max_bytes: int) -> memoryview:
    if m.payload_length > max_bytes:
        raise DeclaredLengthError(f"the manifest declares a {m.payload_length}-byte payload, over {max_bytes}")
    if m.sealed is None:
        if len(payload) != m.payload_length:
            kind = TruncatedPackageError if len(payload) < m.payload_length else TrailingDataError
            raise kind(f"the payload is {len(payload)} bytes, the signed manifest says {m.payload_length}")
        return payload
    if len(payload) != m.sealed.length:
        kind = TruncatedPackageError if len(payload) < m.sealed.length else TrailingDataError
        raise kind(f"the sealed payload is {len(payload)} bytes, the signed manifest says {m.sealed.length}")
    if seal_key is None or seal_key_id(seal_key.public_key()) != m.sealed.recipient:
        raise WrongSealKeyError(f"the payload is sealed for key {m.sealed.recipient[:16]}..., not this site's key")
    return memoryview(unseal(payload, seal_key, info=hpke_info(m.site, m.package, m.version),
                             aad=hashlib.sha256(manifest_body).digest(), plain_length=m.payload_length))


def _check_regions(plain: memoryview, m: Manifest) -> None:
    """Every region in order, aligned, contiguous and inside the payload, then its sha256 (§7 step 10)."""
    regions: tuple[Region, ...] = m.regions
    end = 0
    for i, r in enumerate(regions):
        if r.offset % 64 or r.offset != align(end) or (i == 0 and r.offset != 0):
            raise RegionLayoutError(f"manifest region #{i} at {r.offset} is unaligned, overlapping or leaves a gap")
        end = r.offset + r.length
    if align(end) != m.payload_length:
        raise RegionLayoutError(f"the manifest regions cover {align(end)} bytes, the payload is {m.payload_length}")
    for i, r in enumerate(regions):
        if not hmac.compare_digest(hashlib.sha256(plain[r.offset:r.offset + r.length]).hexdigest(), r.sha256):
            raise RegionDigestError(f"region #{i} ({r.kind} {r.name!r:.60}) does not match its signed sha256")
    layout = read_layout(plain)
    table = [(layout.data_start + e.offset, e.length, e.sha256, e.name) for e in layout.entries]
    if regions[0].length != layout.data_start or table != [(r.offset, r.length, r.sha256, r.name) for r in regions[1:]]:
        raise ManifestMismatchError("the payload's tensor table disagrees with the signed regions")


def open_package(path: str | os.PathLike, *, max_package_bytes: int, **kwargs: Any) -> VerifiedPackage:
    """Map ``path`` read-only and :func:`verify_package` it; plaintext tensors view the map.

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
                raise TruncatedPackageError(f"package file {path} is empty")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise PackageError(f"cannot map package file {path}: {e}") from e
    try:
        return verify_package(mapped, max_package_bytes=max_package_bytes, **kwargs)
    except BaseException:
        try:
            mapped.close()
        except BufferError:
            log.debug("package map still referenced after a failed verification; left to the garbage collector")
        raise
