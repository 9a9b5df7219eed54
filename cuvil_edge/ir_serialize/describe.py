"""Read a package for a person (``cuvil-edge inspect``), not for use.

Nothing here decides whether a package may run: versions, expiry, addressing and the agent's
state are not consulted.  Agents accept packages only through ``verify_and_accept``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize.container import Buffer, _decode_payload, byte_view
from cuvil_edge.ir_serialize.dsse import verify_threshold
from cuvil_edge.ir_serialize.manifest import Manifest, ReleaseStatement
from cuvil_edge.ir_serialize.package import _split_package
from cuvil_edge.ir_serialize.signing import key_id
from cuvil_edge.ir_serialize.trust import TrustRoot


@dataclass(frozen=True)
class PackageDescription:
    """What a package says about itself; ``graph`` is None when the payload is sealed."""

    manifest: Manifest
    release: ReleaseStatement
    graph: Graph | None
    signature: str


def describe_package(
    data: Buffer,
    *,
    max_bytes: int,
    trust_root: TrustRoot | None = None,
    coordinator_key: Ed25519PublicKey | None = None,
) -> PackageDescription:
    """Parse ``data``; check both signatures against ``trust_root`` or the manifest's against
    ``coordinator_key`` when given (signatures first, then the bodies are parsed).

    Raises:
        PackageError: malformed, or a signature check that was asked for failed.
    """
    parts = _split_package(byte_view(data), max_bytes)
    signature = "not checked (pass --key coordinator.pub or root.json to verify)"
    if trust_root is not None:
        trust_root.verify(parts.release, "release")
        trust_root.verify(parts.manifest, "coordinator")
        signature = f"valid (release and coordinator roles of root v{trust_root.version})"
    elif coordinator_key is not None:
        kid = key_id(coordinator_key)
        verify_threshold(parts.manifest, {kid: coordinator_key}, [kid], 1, "coordinator")
        signature = "valid (manifest, coordinator key)"
    manifest = Manifest.from_bytes(parts.manifest.body)
    release = ReleaseStatement.from_bytes(parts.release.body)
    graph = None if manifest.sealed is not None else _decode_payload(parts.payload)
    return PackageDescription(manifest, release, graph, signature)
