"""The package layer (layer 2): IR container, per-site manifest, Ed25519 signing,
verification without IO, and durable anti-rollback state.

``docs/PACKAGE_SPEC.md`` is the normative description; code comments cite its sections.
"""

from cuvil_edge.ir_serialize.container import decode_payload, encode_payload
from cuvil_edge.ir_serialize.manifest import Manifest
from cuvil_edge.ir_serialize.package import write_package
from cuvil_edge.ir_serialize.signing import (
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    save_private_key,
    save_public_key,
)
from cuvil_edge.ir_serialize.state import AcceptedVersion, AntiRollbackState
from cuvil_edge.ir_serialize.verify import VerifiedPackage, open_package, verify_package

__all__ = [
    "AcceptedVersion",
    "AntiRollbackState",
    "Manifest",
    "VerifiedPackage",
    "decode_payload",
    "encode_payload",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "open_package",
    "save_private_key",
    "save_public_key",
    "verify_package",
    "write_package",
]
