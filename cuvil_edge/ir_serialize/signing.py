"""Ed25519 keys: DSSE PAE, the bytes every signature covers (PACKAGE_SPEC §4; signing and checking are
:mod:`cuvil_edge.ir_serialize.dsse`), key ids and key files (§10)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import KeyFileError

log = logging.getLogger(__name__)

PathLike = str | os.PathLike
SIGNATURE_BYTES = 64
MAX_KEY_FILE_BYTES = 16 * 1024


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: ``"DSSEv1" SP len(type) SP type SP len(body) SP body``."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), bytes(body))


def key_id(public_key: Ed25519PublicKey) -> str:
    """sha256 hex of the raw 32-byte public key (PACKAGE_SPEC §10)."""
    return hashlib.sha256(raw_public(public_key)).hexdigest()


def generate_keypair() -> tuple[Ed25519PrivateKey, Ed25519PublicKey]:
    """A fresh Ed25519 key pair."""
    private = Ed25519PrivateKey.generate()
    return private, private.public_key()


def save_private_key(key: Ed25519PrivateKey, path: PathLike) -> None:
    """Write ``key`` as unencrypted PEM PKCS#8, mode 0600, atomically.

    Raises:
        KeyFileError: the file cannot be written.
    """
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        atomic_write(Path(path), pem, mode=0o600)
    except OSError as e:
        raise KeyFileError(f"cannot write private key file {path}: {e}") from e


def load_private_key(path: PathLike) -> Ed25519PrivateKey:
    """Read a PEM PKCS#8 Ed25519 private key (warns if group/world can read it).

    Raises:
        KeyFileError: missing, unreadable, not PEM, or not an Ed25519 key.
    """
    data = _read_key_file(path)
    if os.stat(path).st_mode & 0o077:
        log.warning("private key file %s is readable by group or others; chmod 600 it", path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path} is not an unencrypted PEM PKCS#8 private key ({e})") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def save_public_key(key: Ed25519PublicKey, path: PathLike) -> None:
    """Write the raw 32-byte public key as one line of 64 lowercase hex digits (PACKAGE_SPEC §10).

    Raises:
        KeyFileError: the file cannot be written.
    """
    try:
        atomic_write(Path(path), raw_public(key).hex().encode("ascii") + b"\n", mode=0o644)
    except OSError as e:
        raise KeyFileError(f"cannot write public key file {path}: {e}") from e


def load_public_key(path: PathLike) -> Ed25519PublicKey:
    """Read a public key file written by :func:`save_public_key`.

    Raises:
        KeyFileError: missing, unreadable, or not 64 hex digits.
    """
    text = _read_key_file(path).decode("ascii", errors="replace").strip()
    if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise KeyFileError(f"{path} must hold one line of 64 hex digits (a raw Ed25519 public key)")
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))


def raw_public(key: Ed25519PublicKey) -> bytes:
    """The raw 32-byte public key."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _read_key_file(path: PathLike) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise KeyFileError(f"cannot read key file {path}: {e}") from e
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {path} is larger than {MAX_KEY_FILE_BYTES} bytes; it is not a key")
    return data
