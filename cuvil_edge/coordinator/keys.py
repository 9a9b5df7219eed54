"""The federation's keys on disk and the trust root they form (PACKAGE_SPEC §10, §13).

A keys directory holds::

    root.key  release.key  coordinator.key   current private keys, one per role (0600)
    coordinator.pub                          the coordinator's public key (for `inspect`)
    root.json                                the current signed trust root (pin this on agents)
    root.<N>.json                            every root version, for agents that must catch up
    retired/<role>-<keyid16>.key             keys replaced by a rotation (delete once agents moved on)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import KeyFileError, PackageError
from cuvil_edge.ir_serialize import (
    TrustRoot,
    generate_keypair,
    key_id,
    load_pinned_root,
    load_private_key,
    make_root,
    save_private_key,
    save_public_key,
    sign_root,
)
from cuvil_edge.ir_serialize.trust import ROLES, Role, root_envelope_object, update_root

PRIVATE_NAME = "coordinator.key"
PUBLIC_NAME = "coordinator.pub"
ROOT_NAME = "root.json"
ROOT_VALIDITY_S = 365 * 24 * 3600
#: Root versions shipped inside each package so agents can catch up (PACKAGE_SPEC §10.3).
SHIPPED_CHAIN = 32


@dataclass(frozen=True)
class SigningKeys:
    """What the coordinator signs packages with: its online key, the release key, the root chain."""

    coordinator: Ed25519PrivateKey
    release: Ed25519PrivateKey
    roots: tuple[Any, ...]


def init_keys(directory: Path, force: bool = False, validity_s: int = ROOT_VALIDITY_S) -> tuple[Path, Path]:
    """Create root, release and coordinator keys and root.json v1; returns (coordinator.key, root.json).

    Raises:
        KeyFileError: keys already exist there and ``force`` is not set.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not force and any((directory / n).exists() for n in (PRIVATE_NAME, PUBLIC_NAME, ROOT_NAME, "root.key")):
        raise KeyFileError(
            f"{directory} already holds keys; use --force to replace them "
            "(agents pinned to the old root.json will reject new packages)"
        )
    for old in directory.glob("root.*.json"):
        old.unlink()
    private = {role: generate_keypair()[0] for role in ROLES}
    for role, key in private.items():
        save_private_key(key, directory / f"{role}.key")
    save_public_key(private["coordinator"].public_key(), directory / PUBLIC_NAME)
    root = make_root(1, int(time.time()) + validity_s, {r: [k.public_key()] for r, k in private.items()})
    _publish(directory, sign_root(root, [private["root"]]), 1)
    return directory / PRIVATE_NAME, directory / ROOT_NAME


def current_root(directory: Path) -> TrustRoot:
    """The keys directory's root.json, checked against its own root keys.

    Raises:
        KeyFileError: missing or not a valid self-signed root.
    """
    try:
        return load_pinned_root((Path(directory) / ROOT_NAME).read_bytes())
    except (OSError, PackageError) as e:
        raise KeyFileError(f"{directory}/{ROOT_NAME}: not a usable trust root ({e}); run `cuvil-edge keys init`") from e


def rotate_key(directory: Path, role: str, validity_s: int = ROOT_VALIDITY_S) -> TrustRoot:
    """Replace ``role``'s key by a fresh one in root N+1, signed by the old and new root keys.

    Raises:
        KeyFileError: unknown role, missing key files or root.json.
    """
    if role not in ROLES:
        raise KeyFileError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    directory = Path(directory)
    old = current_root(directory)
    old_key = load_private_key(directory / f"{role}.key")
    new_key = generate_keypair()[0]
    roles = dict(old.roles)
    kept = tuple(k for k in roles[role].keyids if k != key_id(old_key.public_key()))
    roles[role] = Role(tuple(sorted(kept + (key_id(new_key.public_key()),))), roles[role].threshold)
    keys = {**old.keys, key_id(new_key.public_key()): new_key.public_key()}
    root = _next_root(old, keys, roles, validity_s)
    data = sign_root(root, _root_signers(directory, old, root) + [new_key])
    update_root(old, data)  # refuse to publish what agents would reject
    retired = directory / "retired"
    retired.mkdir(mode=0o700, exist_ok=True)
    os.replace(directory / f"{role}.key", retired / f"{role}-{key_id(old_key.public_key())[:16]}.key")
    save_private_key(new_key, directory / f"{role}.key")
    if role == "coordinator":
        save_public_key(new_key.public_key(), directory / PUBLIC_NAME)
    _publish(directory, data, root.version)
    return current_root(directory)


def revoke_key(directory: Path, keyid: str, validity_s: int = ROOT_VALIDITY_S) -> TrustRoot:
    """Publish root N+1 without ``keyid`` (a prefix of at least 8 hex digits is enough).

    Raises:
        KeyFileError: no such key, ambiguous prefix, or a role would be left below its threshold.
    """
    directory = Path(directory)
    old = current_root(directory)
    matches = [k for k in old.keys if len(keyid) >= 8 and k.startswith(keyid.lower())]
    if len(matches) != 1:
        raise KeyFileError(f"key id {keyid!r} matches {len(matches)} keys of root v{old.version}; give more digits")
    kid = matches[0]
    roles = {n: Role(tuple(k for k in r.keyids if k != kid), r.threshold) for n, r in old.roles.items()}
    short = [n for n, r in roles.items() if len(r.keyids) < r.threshold]
    if short:
        raise KeyFileError(f"revoking {kid[:16]} leaves role(s) {short} below threshold; `keys rotate` them instead")
    keys = {k: v for k, v in old.keys.items() if k != kid}
    root = _next_root(old, keys, roles, validity_s)
    data = sign_root(root, _root_signers(directory, old, root))
    update_root(old, data)
    _publish(directory, data, root.version)
    return current_root(directory)


def load_signing_keys(coordinator_key: Path) -> SigningKeys:
    """The coordinator's and release keys and root chain from the directory of ``coordinator_key``.

    Raises:
        KeyFileError: a key file is missing or invalid.
    """
    directory = Path(coordinator_key).parent
    versions = sorted(
        int(p.name.split(".")[1]) for p in directory.glob("root.*.json") if p.name.split(".")[1].isdigit()
    )
    chain = tuple(
        root_envelope_object((directory / f"root.{v}.json").read_bytes()) for v in versions[-SHIPPED_CHAIN:] if v > 1
    )
    return SigningKeys(load_private_key(coordinator_key), load_private_key(directory / "release.key"), chain)


def _next_root(old: TrustRoot, keys: dict, roles: dict, validity_s: int) -> TrustRoot:
    used = {k for r in roles.values() for k in r.keyids}
    return TrustRoot(
        old.version + 1, int(time.time()) + validity_s, {k: v for k, v in keys.items() if k in used}, roles
    )


def _root_signers(directory: Path, old: TrustRoot, new: TrustRoot) -> list[Ed25519PrivateKey]:
    """Every private key in ``directory`` that is a root key of ``old`` or ``new``."""
    wanted = set(old.roles["root"].keyids) | set(new.roles["root"].keyids)
    keys = [load_private_key(p) for p in sorted(directory.glob("*.key"))]
    return [k for k in keys if key_id(k.public_key()) in wanted]


def _publish(directory: Path, data: bytes, version: int) -> None:
    atomic_write(directory / f"root.{version}.json", data, mode=0o644)
    atomic_write(directory / ROOT_NAME, data, mode=0o644)
