"""The package layer (layer 2): IR container, release statement and per-site manifest (DSSE,
Ed25519), trust root with rotation, sealing, durable anti-rollback state, and the one entry
point agents accept packages through: :func:`verify_and_accept` (or :func:`open_package` for a
file).  The verification steps behind it are private.

``docs/PACKAGE_SPEC.md`` is the normative description; code comments cite its sections.
"""

from cuvil_edge.ir_serialize.container import encode_payload
from cuvil_edge.ir_serialize.describe import PackageDescription, describe_package
from cuvil_edge.ir_serialize.manifest import Manifest, Region, ReleaseStatement
from cuvil_edge.ir_serialize.package import SignedRelease, payload_regions, sign_release, write_package
from cuvil_edge.ir_serialize.signing import (
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    save_private_key,
    save_public_key,
)
from cuvil_edge.ir_serialize.state import AcceptedVersion, AntiRollbackState, RollbackSnapshot, TrustState
from cuvil_edge.ir_serialize.trust import TrustRoot, load_pinned_root, make_root, sign_root, update_root
from cuvil_edge.ir_serialize.verify import VerifiedPackage, open_package, verify_and_accept

__all__ = [
    "AcceptedVersion",
    "AntiRollbackState",
    "Manifest",
    "PackageDescription",
    "Region",
    "ReleaseStatement",
    "RollbackSnapshot",
    "SignedRelease",
    "TrustRoot",
    "TrustState",
    "VerifiedPackage",
    "describe_package",
    "encode_payload",
    "generate_keypair",
    "key_id",
    "load_pinned_root",
    "load_private_key",
    "load_public_key",
    "make_root",
    "open_package",
    "payload_regions",
    "save_private_key",
    "save_public_key",
    "sign_release",
    "sign_root",
    "update_root",
    "verify_and_accept",
    "write_package",
]
