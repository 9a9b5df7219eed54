"""Sealing a payload for one site (PACKAGE_SPEC §9): HPKE-wrapped content key, chunked AEAD.

Sealed payload layout::

    prelude  magic "CUVLSEAL" | u32 version = 1 | u32 chunk size C | u64 plaintext length L
    wrapped  80 bytes: HPKE(X25519, HKDF-SHA256, ChaCha20-Poly1305) enc || ct of the 32-byte key
    chunks   ceil(L / C) chunks (one empty chunk when L = 0), each ChaCha20-Poly1305(min(C, rest)) + 16-byte tag

Chunk nonce = 4 zero bytes || 7-byte big-endian index || 1 byte (1 on the last chunk, else 0);
associated data = sha256 of the signed manifest bytes || the 24-byte sealed prelude (so the
chunk size and length are authenticated too).  HPKE ``info`` =
``"cuvil-seal/1|" site "|" package "|" version``.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import (
    DeclaredLengthError,
    KeyFileError,
    SealingError,
    TrailingDataError,
    TruncatedPackageError,
    UnsupportedFormatError,
    WrongSealKeyError,
)

MAGIC = b"CUVLSEAL"
VERSION = 1
PRELUDE = struct.Struct("<8sIIQ")
WRAPPED_BYTES = 32 + 32 + 16
TAG = 16
DEFAULT_CHUNK = 4 * 2**20
MIN_CHUNK, MAX_CHUNK = 4096, 64 * 2**20
_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


def seal_key_id(public: X25519PublicKey) -> str:
    """sha256 hex of the raw 32-byte X25519 public key."""
    return hashlib.sha256(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()


def hpke_info(site: str, package: str, version: int) -> bytes:
    return f"cuvil-seal/1|{site}|{package}|{version}".encode()


def _nonce(index: int, last: bool) -> bytes:
    return b"\0\0\0\0" + index.to_bytes(7, "big") + (b"\1" if last else b"\0")


def sealed_length(plain_length: int, chunk: int = DEFAULT_CHUNK) -> int:
    """Exact sealed size for a plaintext of ``plain_length`` bytes."""
    chunks = max(1, -(-plain_length // chunk))
    return PRELUDE.size + WRAPPED_BYTES + plain_length + chunks * TAG


def seal(plain: bytes, recipient: X25519PublicKey, *, info: bytes, aad: bytes, chunk: int = DEFAULT_CHUNK) -> bytes:
    """Encrypt ``plain`` under a fresh content key wrapped for ``recipient``."""
    key = ChaCha20Poly1305.generate_key()
    aead = ChaCha20Poly1305(key)
    view = memoryview(plain)
    prelude = PRELUDE.pack(MAGIC, VERSION, chunk, len(plain))
    out = bytearray(prelude)
    out += _SUITE.encrypt(key, recipient, info=info)
    aad = bytes(aad) + prelude
    count = max(1, -(-len(plain) // chunk))
    for i in range(count):
        out += aead.encrypt(_nonce(i, i == count - 1), bytes(view[i * chunk : (i + 1) * chunk]), aad)
    return bytes(out)


def unseal(sealed: memoryview, private: X25519PrivateKey, *, info: bytes, aad: bytes, plain_length: int) -> bytearray:
    """Decrypt a sealed payload; no byte of a chunk is released before its tag verifies.

    Raises:
        UnsupportedFormatError: bad magic, version or chunk size.
        DeclaredLengthError / TruncatedPackageError / TrailingDataError: sizes disagree (checked before allocating).
        WrongSealKeyError: the content key was not wrapped for ``private`` (or for this site/package/version).
        SealingError: a chunk fails authentication (tampered, reordered, truncated or for another manifest).
    """
    if len(sealed) < PRELUDE.size + WRAPPED_BYTES:
        raise TruncatedPackageError(f"the sealed payload is {len(sealed)} bytes, shorter than its prelude")
    magic, version, chunk, length = PRELUDE.unpack_from(sealed, 0)
    if magic != MAGIC or version != VERSION:
        raise UnsupportedFormatError(f"sealed payload magic/version {magic!r}/{version} not supported")
    if not MIN_CHUNK <= chunk <= MAX_CHUNK:
        raise UnsupportedFormatError(f"sealed chunk size {chunk} outside {MIN_CHUNK}..{MAX_CHUNK}")
    if length != plain_length:
        raise DeclaredLengthError(f"the sealed payload declares {length} plaintext bytes, the manifest {plain_length}")
    expected = sealed_length(length, chunk)
    if len(sealed) < expected:
        raise TruncatedPackageError(f"the sealed payload is {len(sealed)} bytes, its layout needs {expected}")
    if len(sealed) > expected:
        raise TrailingDataError(f"the sealed payload has {len(sealed) - expected} bytes after its last chunk")
    start = PRELUDE.size
    try:
        key = _SUITE.decrypt(bytes(sealed[start : start + WRAPPED_BYTES]), private, info=info)
    except (InvalidTag, ValueError) as e:
        raise WrongSealKeyError(
            "the payload's content key is not sealed for this site's key (or for another "
            "site, package or version); ask the coordinator to seal for this site"
        ) from e
    if len(key) != 32:
        raise SealingError("the unwrapped content key is not 32 bytes")
    aead, out = ChaCha20Poly1305(key), bytearray(length)
    aad = bytes(aad) + bytes(sealed[: PRELUDE.size])
    pos, count = start + WRAPPED_BYTES, max(1, -(-length // chunk))
    for i in range(count):
        n = min(chunk, length - i * chunk)
        try:
            plain = aead.decrypt(_nonce(i, i == count - 1), bytes(sealed[pos : pos + n + TAG]), aad)
        except InvalidTag as e:
            raise SealingError(
                f"sealed chunk {i} fails authentication; the payload was altered or belongs to another manifest"
            ) from e
        out[i * chunk : i * chunk + n] = plain
        pos += n + TAG
    return out


def generate_seal_keypair() -> tuple[X25519PrivateKey, X25519PublicKey]:
    private = X25519PrivateKey.generate()
    return private, private.public_key()


def save_seal_keys(private: X25519PrivateKey, directory: Path) -> tuple[Path, Path]:
    """Write ``seal.key`` (PEM PKCS#8, 0600) and ``seal.pub`` (64 hex + newline) in ``directory``.

    Raises:
        KeyFileError: the files cannot be written.
    """
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    paths = (Path(directory) / "seal.key", Path(directory) / "seal.pub")
    try:
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(paths[0], pem, mode=0o600)
        atomic_write(paths[1], raw.hex().encode("ascii") + b"\n", mode=0o644)
    except OSError as e:
        raise KeyFileError(f"cannot write sealing keys in {directory}: {e}") from e
    return paths


def load_seal_private(path: Path) -> X25519PrivateKey:
    """Raises: KeyFileError: missing, unreadable or not an X25519 PEM key."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes()[:16384], password=None)
    except (OSError, ValueError, TypeError) as e:
        raise KeyFileError(f"{path}: not a readable X25519 PEM private key ({e})") from e
    if not isinstance(key, X25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an X25519 private key")
    return key
