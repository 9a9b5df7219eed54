"""DSSE envelopes and threshold signature checks (PACKAGE_SPEC §4).

An envelope is the canonical JSON object
``{"payload": <base64>, "payloadType": <str>, "signatures": [{"keyid": <hex>, "sig": <base64>}, ...]}``.
Signatures are Ed25519 over ``PAE(payloadType, payload)``; the payload bytes are
verified first and only then parsed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cuvil_edge.errors import (
    BadSignatureError,
    PackageFormatError,
    RevokedKeyError,
    ThresholdError,
    UnsupportedFormatError,
    UntrustedKeyError,
)
from cuvil_edge.ir_serialize._canonical import b64decode_strict, b64encode, fields, get_list, get_str, hex_digest
from cuvil_edge.ir_serialize.signing import SIGNATURE_BYTES, key_id, pae

#: Most signatures one envelope may carry (PACKAGE_SPEC §8).
MAX_SIGNATURES = 16
ENVELOPE_KEYS = ("payload", "payloadType", "signatures")


@dataclass(frozen=True)
class Envelope:
    """A parsed, not yet verified DSSE envelope."""

    payload_type: str
    body: bytes
    signatures: tuple[tuple[str, bytes], ...]  # (keyid, signature)

    def to_dict(self) -> dict[str, Any]:
        return {
            "payload": b64encode(self.body),
            "payloadType": self.payload_type,
            "signatures": [{"keyid": k, "sig": b64encode(s)} for k, s in self.signatures],
        }


def sign_envelope(payload_type: str, body: bytes, keys: Iterable[Ed25519PrivateKey]) -> Envelope:
    """Sign ``body`` with every key in ``keys`` (sorted by key id)."""
    signed = {key_id(k.public_key()): k.sign(pae(payload_type, body)) for k in keys}
    return Envelope(payload_type, bytes(body), tuple(sorted(signed.items())))


def parse_envelope(obj: Any, payload_type: str, max_body: int, where: str) -> Envelope:
    """Structure of an envelope (§4.1); nothing is verified yet.

    Raises:
        UnsupportedFormatError: another payload type (schema major version) or unknown fields.
        PackageFormatError: malformed fields, duplicate key ids, too many signatures.
        DeclaredLengthError: the payload is larger than ``max_body``.
    """
    e = fields(obj, ENVELOPE_KEYS, where)
    declared = get_str(e, "payloadType", where)
    if declared != payload_type:
        raise UnsupportedFormatError(
            f"{where} has payload type {declared!r:.100}, this reader expects {payload_type!r}"
        )
    sigs = get_list(e, "signatures", where)
    if not 1 <= len(sigs) <= MAX_SIGNATURES:
        raise PackageFormatError(f"{where} must carry 1..{MAX_SIGNATURES} signatures, has {len(sigs)}")
    parsed: list[tuple[str, bytes]] = []
    for i, s in enumerate(sigs):
        s = fields(s, ("keyid", "sig"), f"{where} signature #{i}")
        sig = b64decode_strict(s["sig"], f"{where} signature #{i}", SIGNATURE_BYTES)
        if len(sig) != SIGNATURE_BYTES:
            raise PackageFormatError(f"{where} signature #{i} is {len(sig)} bytes, not {SIGNATURE_BYTES}")
        parsed.append((hex_digest(s["keyid"], f"{where} signature #{i} keyid"), sig))
    keyids = [k for k, _ in parsed]
    if len(set(keyids)) != len(keyids):
        raise PackageFormatError(f"{where} lists a key id twice; each key signs at most once")
    return Envelope(declared, b64decode_strict(e["payload"], f"{where} payload", max_body), tuple(parsed))


def verify_threshold(
    env: Envelope,
    keys: Mapping[str, Ed25519PublicKey],
    keyids: Iterable[str],
    threshold: int,
    role: str,
    revoked: Iterable[str] = (),
) -> int:
    """Require ``threshold`` distinct keys of ``keyids`` to have signed ``env`` (§4.2); returns the count.

    Raises:
        BadSignatureError: a signature by a key of the role does not verify (and the threshold is not met).
        RevokedKeyError: only keys removed by an earlier root rotation signed.
        UntrustedKeyError: no key of the role signed.
        ThresholdError: some, but fewer than ``threshold``, keys of the role signed.
    """
    allowed = set(keyids) - set(revoked)  # a revoked key never counts, even if a root lists it again
    message = pae(env.payload_type, env.body)
    good, bad = 0, 0
    for kid, sig in env.signatures:
        if kid not in allowed or kid not in keys:
            continue
        try:
            keys[kid].verify(sig, message)
            good += 1
        except InvalidSignature:
            bad += 1
    if good >= threshold:
        return good
    if bad:
        raise BadSignatureError(
            f"a {role} signature does not verify over the exact signed bytes; the envelope was tampered with"
        )
    if good:
        raise ThresholdError(f"only {good} of the required {threshold} {role} keys signed")
    signers = [k for k, _ in env.signatures]
    if set(signers) & set(revoked):
        raise RevokedKeyError(
            f"signed by revoked key(s) {[k[:16] for k in signers if k in set(revoked)]}; "
            f"the trust root no longer lists them for {role}"
        )
    raise UntrustedKeyError(f"no {role} key of the trust root signed (signers {[k[:16] for k in signers]})")
