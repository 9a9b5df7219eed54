"""Package verification and acceptance, in the fixed order of PACKAGE_SPEC §7.

:func:`verify_and_accept` is the one entry point: it takes the trust root and the floors from the
agent's durable state, verifies the package against them without other IO, and records the
acceptance (version, digest, release counter, time floor, the root it actually applied) in the
same locked transaction before it returns.  The steps below it are private.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cuvil_edge.errors import (
    ClockRollbackError,
    DeclaredLengthError,
    DigestConflictError,
    ExpiredPackageError,
    ManifestMismatchError,
    NonceError,
    PackageError,
    PackageSizeError,
    RegionDigestError,
    RegionLayoutError,
    ReleaseRollbackError,
    RollbackError,
    TrailingDataError,
    TruncatedPackageError,
    WrongSealKeyError,
    WrongSiteError,
    WrongTargetError,
)
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize._canonical import canonical_json
from cuvil_edge.ir_serialize.container import Buffer, _decode_payload, align, byte_view, read_layout
from cuvil_edge.ir_serialize.manifest import Manifest, Region, ReleaseStatement
from cuvil_edge.ir_serialize.package import _split_package
from cuvil_edge.ir_serialize.sealing import hpke_info, seal_key_id, unseal
from cuvil_edge.ir_serialize.state import AcceptedVersion, AntiRollbackState, RollbackSnapshot, TrustState
from cuvil_edge.ir_serialize.trust import _apply_root_chain

log = logging.getLogger(__name__)

#: How far ``issued_at`` may lie in the agent's future (clock skew), PACKAGE_SPEC §7 step 7.
DEFAULT_CLOCK_SKEW_S = 300


@dataclass(frozen=True)
class VerifiedPackage:
    """A package that passed every check and was recorded as accepted.

    Plaintext ``graph`` initializers view the verified buffer.  ``root_version`` and ``state``
    say which trust root and which state file it was checked against and recorded in.
    """

    manifest: Manifest
    release: ReleaseStatement
    graph: Graph
    payload_digest: str  # sha256 of the canonical region list: identifies the plaintext payload
    manifest_digest: str
    root_version: int
    state: Path
    size: int


def verify_and_accept(
    data: Buffer,
    state: AntiRollbackState,
    *,
    site: str,
    target: str,
    now: int,
    max_package_bytes: int,
    seal_key: X25519PrivateKey | None = None,
    expected_nonce: str | None = None,
    clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
) -> VerifiedPackage:
    """Verify ``data`` against ``state`` (PACKAGE_SPEC §7) and durably record its acceptance (§11)
    before returning; on any failure nothing is recorded.

    Concurrent calls on one state directory are serialised by the state's lock, so two
    deliveries can never both pass the version check against the same old floor.

    Raises:
        PackageSizeError: ``data`` is over ``max_package_bytes`` (checked before anything else).
        PackageError: the first failing step's leaf type (table in PACKAGE_SPEC §7).
        StateError: the state is not initialised, corrupt, or cannot be written.
    """
    if not isinstance(state, AntiRollbackState):
        raise TypeError("verify_and_accept needs the agent's AntiRollbackState")
    size = len(data)
    if size > max_package_bytes:
        raise PackageSizeError(f"the package is {size} bytes, over this agent's limit of {max_package_bytes}")
    with state.transaction() as txn:
        checked, accepted = _check_package(
            data,
            txn.current,
            site=site,
            target=target,
            now=now,
            max_package_bytes=max_package_bytes,
            seal_key=seal_key,
            expected_nonce=expected_nonce,
            clock_skew_s=clock_skew_s,
            where=state.path,
        )
        txn.commit(accepted)  # durable before use (§11.3)
    m = checked.manifest
    log.info(
        "site %s accepted package version %d (%s) under root v%d",
        m.site,
        m.version,
        checked.manifest_digest[:16],
        accepted.snapshot.root_version,
    )
    return VerifiedPackage(
        m,
        checked.release,
        checked.graph,
        checked.payload_digest,
        checked.manifest_digest,
        accepted.snapshot.root_version,
        state.path,
        size,
    )


@dataclass(frozen=True)
class _Checked:
    manifest: Manifest
    release: ReleaseStatement
    graph: Graph
    payload_digest: str
    manifest_digest: str


def _check_package(
    data: Buffer,
    trusted: TrustState,
    *,
    site: str,
    target: str,
    now: int,
    max_package_bytes: int,
    seal_key: X25519PrivateKey | None = None,
    expected_nonce: str | None = None,
    clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
    where: Any = "the state",
) -> tuple[_Checked, TrustState]:
    """The pure verification (no IO): the package checked against ``trusted``, and the state that
    accepting it yields.

    Raises:
        PackageError: the first failing step's leaf type (table in PACKAGE_SPEC §7).
        StateError: ``trusted`` holds no root.
    """
    trusted_root = trusted.require_root(where)
    parts = _split_package(byte_view(data), max_package_bytes)  # 1-2
    update = _apply_root_chain(trusted_root, trusted.root_envelope, parts.roots, now)  # 3
    root = update.root
    root.verify(parts.release, "release")  # 4
    root.verify(parts.manifest, "coordinator")
    release = ReleaseStatement.from_bytes(parts.release.body)  # 5
    manifest = Manifest.from_bytes(parts.manifest.body)
    _check_agreement(manifest, release, parts.release.body)  # 6
    _check_addressing(manifest, site, target, expected_nonce)  # 7
    old = trusted.snapshot
    _check_time(manifest, now, old.time_floor, clock_skew_s)
    manifest_digest = hashlib.sha256(parts.manifest.body).hexdigest()
    # A rotation of the key that signs versions (or releases) resets the floors it set (§11.2):
    # a stolen key's inflated version cannot lock the site out once the root replaces the key.
    sites = {} if "coordinator" in update.rotated_roles else old.sites
    releases = {} if "release" in update.rotated_roles else old.releases
    _check_versions(manifest, release, manifest_digest, sites, releases)  # 8
    plain = _open_payload(parts.payload, manifest, parts.manifest.body, seal_key, max_package_bytes)  # 9
    _check_regions(plain, manifest)  # 10
    graph = _decode_payload(plain, check_digests=False)  # 11 (digests checked in 10)
    accepted = TrustState(
        root,
        update.envelope,
        RollbackSnapshot(
            root.version,
            max(old.time_floor, min(manifest.issued_at, now)),  # never past the agent's own clock (§11.2)
            {**sites, manifest.site: AcceptedVersion(manifest.version, manifest_digest)},
            {**releases, release.package: release.release_counter},
        ),
    )
    checked = _Checked(manifest, release, graph, _content_digest(manifest), manifest_digest)
    return checked, accepted


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
        raise WrongTargetError(
            f"release {r.package!r} is not approved for target {m.target!r} (only {list(r.targets)})"
        )
    mine = [x.to_dict(with_offset=False) for x in m.regions]
    if mine != [x.to_dict(with_offset=False) for x in r.regions]:
        raise ManifestMismatchError(
            "the manifest's regions differ from the release statement's (a region was "
            "replaced, deleted, added or swapped)"
        )


def _check_addressing(m: Manifest, site: str, target: str, expected_nonce: str | None) -> None:
    if m.site != site:
        raise WrongSiteError(f"the package is addressed to site {m.site!r}, this agent is site {site!r}")
    if m.target != target:
        raise WrongTargetError(f"the package is built for target {m.target!r}, this device is {target!r}")
    if expected_nonce is not None and (
        m.nonce is None or not hmac.compare_digest(m.nonce.encode("utf-8"), expected_nonce.encode("utf-8"))
    ):
        raise NonceError("the manifest does not carry this agent's current nonce; a replayed or stale package")


def _check_time(m: Manifest, now: int, time_floor: int, clock_skew_s: int) -> None:
    if now >= m.expires:
        raise ExpiredPackageError(f"package version {m.version} expired at {m.expires} (now {now})")
    if time_floor >= m.expires:
        raise ClockRollbackError(
            f"package version {m.version} expired at {m.expires}, before the latest issue time "
            f"this agent has seen ({time_floor}); this device's clock is set back"
        )
    if m.issued_at > max(now, time_floor) + clock_skew_s:
        raise ExpiredPackageError(
            f"package version {m.version} is issued at {m.issued_at}, in the future beyond the "
            f"{clock_skew_s} s skew; check this device's clock"
        )


def _check_versions(m: Manifest, r: ReleaseStatement, digest: str, sites: Mapping, releases: Mapping) -> None:
    prev = sites.get(m.site)
    if prev is not None and m.version < prev.version:
        raise RollbackError(f"package version {m.version} is older than the accepted {prev.version}")
    if prev is not None and m.version == prev.version and not hmac.compare_digest(digest, prev.digest):
        raise DigestConflictError(f"package version {m.version} was already accepted with another manifest")
    if r.release_counter < releases.get(r.package, 0):
        raise ReleaseRollbackError(
            f"release {r.package!r} counter {r.release_counter} is below the accepted {releases[r.package]}"
        )


def _open_payload(
    payload: memoryview, m: Manifest, manifest_body: bytes, seal_key: X25519PrivateKey | None, max_bytes: int
) -> memoryview:
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
    return memoryview(
        unseal(
            payload,
            seal_key,
            info=hpke_info(m.site, m.package, m.version),
            aad=hashlib.sha256(manifest_body).digest(),
            plain_length=m.payload_length,
        )
    )


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
        if not hmac.compare_digest(hashlib.sha256(plain[r.offset : r.offset + r.length]).hexdigest(), r.sha256):
            raise RegionDigestError(f"region #{i} ({r.kind} {r.name!r:.60}) does not match its signed sha256")
    layout = read_layout(plain)
    table = [(layout.data_start + e.offset, e.length, e.sha256, e.name) for e in layout.entries]
    if regions[0].length != layout.data_start or table != [(r.offset, r.length, r.sha256, r.name) for r in regions[1:]]:
        raise ManifestMismatchError("the payload's tensor table disagrees with the signed regions")


def open_package(
    path: str | os.PathLike, state: AntiRollbackState, *, max_package_bytes: int, **kwargs: Any
) -> VerifiedPackage:
    """Map ``path`` read-only and :func:`verify_and_accept` it; plaintext tensors view the map.

    Raises:
        PackageError: the file cannot be opened or mapped.
        PackageSizeError, ...: everything :func:`verify_and_accept` raises.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_package_bytes:
                raise PackageSizeError(
                    f"package file {path} is {size} bytes, over this agent's limit of {max_package_bytes}"
                )
            if size == 0:
                raise TruncatedPackageError(f"package file {path} is empty")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise PackageError(f"cannot map package file {path}: {e}") from e
    try:
        return verify_and_accept(mapped, state, max_package_bytes=max_package_bytes, **kwargs)
    except BaseException:
        try:
            mapped.close()
        except BufferError:
            log.debug("package map still referenced after a failed verification; left to the garbage collector")
        raise
