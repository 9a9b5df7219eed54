"""The trust root (PACKAGE_SPEC §10): root.json, roles with thresholds, N -> N+1 rotation.

``root.json`` is a DSSE envelope (§4) of type ``application/vnd.cuvil.root.v1+json``
whose payload is the canonical root object::

    {"format": 1, "version": N, "expires": T,
     "keys": {"<keyid>": "<64 hex raw Ed25519 public key>", ...},
     "roles": {"root": {"keyids": [...], "threshold": k},
               "release": {...}, "coordinator": {...}}}

Everything here is pure: no IO, no clock (callers pass ``now``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cuvil_edge.errors import (
    DeclaredLengthError,
    ExpiredRootError,
    PackageError,
    PackageFormatError,
    RootChainTooLongError,
    RootRotationError,
    UnsupportedFormatError,
)
from cuvil_edge.ir_serialize._canonical import (
    canonical_json,
    fields,
    get_int,
    get_list,
    hex_digest,
    parse_json,
)
from cuvil_edge.ir_serialize.dsse import Envelope, parse_envelope, sign_envelope, verify_threshold
from cuvil_edge.ir_serialize.signing import key_id, raw_public

ROOT_TYPE = "application/vnd.cuvil.root.v1+json"
ROOT_FORMAT = 1
ROLES = ("coordinator", "release", "root")
MAX_ROOT_BYTES = 64 * 1024  # PACKAGE_SPEC §8
MAX_ROOT_CHAIN = 32  # PACKAGE_SPEC §10.3
MAX_KEYS = 64


@dataclass(frozen=True)
class Role:
    keyids: tuple[str, ...]
    threshold: int

    def same_as(self, other: Role) -> bool:
        """Same key ids (in any order) and threshold."""
        return set(self.keyids) == set(other.keyids) and self.threshold == other.threshold


@dataclass(frozen=True)
class TrustRoot:
    """One version of the trust root (§10.1), plus the key ids dropped by rotations seen so far."""

    version: int
    expires: int
    keys: Mapping[str, Ed25519PublicKey]
    roles: Mapping[str, Role]
    revoked: frozenset[str] = field(default_factory=frozenset)

    def role(self, name: str) -> Role:
        return self.roles[name]

    def verify(self, env: Envelope, role: str) -> int:
        """Threshold check of ``env`` for ``role`` (§4.2); see :func:`verify_threshold`."""
        r = self.roles[role]
        return verify_threshold(env, self.keys, r.keyids, r.threshold, role, self.revoked)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": ROOT_FORMAT,
            "version": self.version,
            "expires": self.expires,
            "keys": {k: raw_public(v).hex() for k, v in sorted(self.keys.items())},
            "roles": {n: {"keyids": sorted(r.keyids), "threshold": r.threshold} for n, r in sorted(self.roles.items())},
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_dict(), "trust root")

    @staticmethod
    def from_bytes(body: bytes) -> TrustRoot:
        """Strict parse of a root payload (§10.1).

        Raises:
            PackageFormatError: malformed, unknown fields, unsatisfiable thresholds, bad key ids.
        """
        d = fields(parse_json(body, "trust root"), ("format", "version", "expires", "keys", "roles"), "trust root")
        if get_int(d, "format", "trust root") != ROOT_FORMAT:
            raise UnsupportedFormatError(
                f"trust root format {d['format']} is not supported (this reader: {ROOT_FORMAT})"
            )
        if not isinstance(d["keys"], dict) or len(d["keys"]) > MAX_KEYS:
            raise PackageFormatError(f"trust root 'keys' must be an object of at most {MAX_KEYS} keys")
        keys = {hex_digest(k, "trust root key id"): _public_from_hex(v, k) for k, v in d["keys"].items()}
        roles_obj = fields(d["roles"], ROLES, "trust root roles")
        roles = {}
        for name in ROLES:
            r = fields(roles_obj[name], ("keyids", "threshold"), f"trust root role {name!r}")
            keyids = tuple(hex_digest(k, f"role {name!r} key id") for k in get_list(r, "keyids", name))
            threshold = get_int(r, "threshold", f"role {name!r}", 1, MAX_KEYS)
            if len(set(keyids)) != len(keyids) or not set(keyids) <= keys.keys() or threshold > len(keyids):
                raise PackageFormatError(
                    f"trust root role {name!r}: key ids must be unique, listed under 'keys', "
                    f"and at least the threshold {threshold}"
                )
            roles[name] = Role(keyids, threshold)
        return TrustRoot(get_int(d, "version", "trust root", 1), get_int(d, "expires", "trust root"), keys, roles)


def _public_from_hex(value: Any, kid: str) -> Ed25519PublicKey:
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise PackageFormatError("trust root keys must be 64 lowercase hex digits (raw Ed25519)")
    raw = bytes.fromhex(value)
    if hashlib.sha256(raw).hexdigest() != kid:
        raise PackageFormatError(f"trust root key id {kid[:16]}... is not the sha256 of its key")
    return Ed25519PublicKey.from_public_bytes(raw)


def make_root(
    version: int,
    expires: int,
    role_keys: Mapping[str, Sequence[Ed25519PublicKey]],
    thresholds: Mapping[str, int] | None = None,
) -> TrustRoot:
    """A root object for ``role_keys`` (role -> public keys); thresholds default to 1.

    Raises:
        PackageFormatError: a role is missing or its threshold exceeds its key count.
    """
    keys = {key_id(k): k for ks in role_keys.values() for k in ks}
    roles = {n: Role(tuple(sorted(key_id(k) for k in role_keys[n])), (thresholds or {}).get(n, 1)) for n in ROLES}
    root = TrustRoot(version, expires, keys, roles)
    return TrustRoot.from_bytes(root.to_bytes())  # the same checks a reader applies


def sign_root(root: TrustRoot, keys: Iterable[Ed25519PrivateKey]) -> bytes:
    """The root.json bytes: a canonical DSSE envelope signed by ``keys``."""
    return canonical_json(sign_envelope(ROOT_TYPE, root.to_bytes(), keys).to_dict(), "root envelope")


def root_envelope(data: bytes | Any) -> Envelope:
    """The DSSE structure of root.json bytes or of an already-decoded envelope object; the body
    is neither verified nor parsed here.

    Raises:
        DeclaredLengthError: over 64 KiB.
        PackageFormatError: malformed envelope.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        if len(data) > MAX_ROOT_BYTES:
            raise DeclaredLengthError(f"root.json is {len(data)} bytes, over the {MAX_ROOT_BYTES}-byte cap")
        data = parse_json(bytes(data), "root envelope", canonical=False)
    return parse_envelope(data, ROOT_TYPE, MAX_ROOT_BYTES, "root envelope")


def load_pinned_root(data: bytes | Any, now: int | None = None) -> TrustRoot:
    """Bootstrap trust from a pinned root.json: it must meet its own root threshold (§10.2).

    The pinned file comes from the operator, not the network, so its body is parsed to learn
    the keys that then check it.

    Raises:
        RootRotationError: it is not signed by a threshold of its own root keys.
        ExpiredRootError: ``now`` is given and the root has expired.
        PackageFormatError: malformed.
    """
    env = root_envelope(data)
    root = TrustRoot.from_bytes(env.body)
    try:
        root.verify(env, "root")
    except PackageError as e:
        raise RootRotationError(f"the pinned root.json v{root.version} is not signed by its own root keys: {e}") from e
    if now is not None and now >= root.expires:
        raise ExpiredRootError(f"the pinned root.json v{root.version} expired at {root.expires} (now {now})")
    return root


def update_root(current: TrustRoot, data: bytes | Any) -> TrustRoot:
    """Apply one rotation N -> N+1 (§10.3).  In this order: the link's signatures are checked
    against a threshold of N's root keys over its exact bytes, and only then is its body parsed;
    its version must be exactly N+1; it must meet a threshold of its own root keys; it must not
    list a key id that an earlier rotation revoked.  Expiry is not checked here (only on the
    final root).  Revoked key ids accumulate: a key dropped once is never trusted again.

    Raises:
        RootRotationError: not signed by N's root keys, wrong version, not self-signed, or it
            re-lists a revoked key (the cause is chained).
        PackageFormatError: malformed (after the signature by N's keys verified).
    """
    env = root_envelope(data)
    try:
        current.verify(env, "root")
    except PackageError as e:
        raise RootRotationError(
            f"a root update is not signed by a threshold of the trusted root v{current.version} keys: {e}"
        ) from e
    new = TrustRoot.from_bytes(env.body)
    if new.version != current.version + 1:
        raise RootRotationError(
            f"root update has version {new.version}; only {current.version + 1} can follow "
            f"{current.version} (roots are applied one version at a time)"
        )
    try:
        new.verify(env, "root")
    except PackageError as e:
        raise RootRotationError(f"root v{new.version} is not signed by a threshold of its own root keys: {e}") from e
    relisted = sorted(set(new.keys) & current.revoked)
    if relisted:
        raise RootRotationError(
            f"root v{new.version} lists key(s) {[k[:16] for k in relisted]} that an earlier "
            "rotation revoked; a revoked key is never trusted again, publish a fresh key"
        )
    dropped = frozenset(set(current.keys) - set(new.keys)) | current.revoked
    return TrustRoot(new.version, new.expires, new.keys, new.roles, dropped)


@dataclass(frozen=True)
class RootUpdate:
    """The outcome of :func:`_apply_root_chain`: the root now trusted, its envelope (exactly the
    link that was applied, or the trusted one when none was), and the roles whose keys or
    threshold changed on the way (their floors are reset, PACKAGE_SPEC §11.2)."""

    root: TrustRoot
    envelope: Any
    rotated_roles: frozenset[str]


def _apply_root_chain(
    trusted: TrustRoot, trusted_envelope: Any, chain: Sequence[Any], now: int, max_chain: int = MAX_ROOT_CHAIN
) -> RootUpdate:
    """Bring ``trusted`` up to date with the root chain a package carries (§10.3).

    Links are located by bytes, never by what they claim: the links up to and including the
    one byte-identical to the trusted root are skipped unread; every later link is checked
    against its predecessor (:func:`update_root`) before anything in it is used.  When the
    trusted root is not in the chain, the first link must be its successor; a link claiming a
    version at or below the trusted one is refused (it would differ from the trusted root).

    Raises:
        RootChainTooLongError: more than ``max_chain`` links.
        RootRotationError: a duplicated link, a link out of order or not signed by the old and
            new root keys, a re-listed revoked key.
        ExpiredRootError: the final root has expired.
    """
    if len(chain) > max_chain:
        raise RootChainTooLongError(f"{len(chain)} root updates offered; at most {max_chain} are applied at once")
    encoded = [canonical_json(link, "root chain link") for link in chain]
    if len(set(encoded)) != len(encoded):
        raise RootRotationError("the package's root chain lists the same root twice")
    mine = canonical_json(trusted_envelope, "trusted root")
    start = encoded.index(mine) + 1 if mine in encoded else 0
    root, envelope, rotated = trusted, trusted_envelope, set()
    for link in chain[start:]:
        new = update_root(root, link)
        rotated |= {name for name in ROLES if not new.roles[name].same_as(root.roles[name])}
        root, envelope = new, link
    if now >= root.expires:
        raise ExpiredRootError(
            f"trust root v{root.version} expired at {root.expires} (now {now}); the federation must publish a new root"
        )
    return RootUpdate(root, envelope, frozenset(rotated))


def root_envelope_object(data: bytes) -> Any:
    """root.json bytes as a JSON object (to embed in a package envelope)."""
    return json.loads(data)
