"""The coordinator's signing key pair on disk."""

from __future__ import annotations

from pathlib import Path

from cuvil_edge.errors import KeyFileError
from cuvil_edge.ir_serialize import generate_keypair, save_private_key, save_public_key

PRIVATE_NAME = "coordinator.key"
PUBLIC_NAME = "coordinator.pub"


def init_keys(directory: Path, force: bool = False) -> tuple[Path, Path]:
    """Create a fresh Ed25519 coordinator key pair in ``directory``.

    Raises:
        KeyFileError: keys already exist there and ``force`` is not set.
    """
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / PRIVATE_NAME, directory / PUBLIC_NAME
    if not force and (private.exists() or public.exists()):
        raise KeyFileError(f"{directory} already holds coordinator keys; use --force to replace them "
                           "(agents pinned to the old key will reject new packages)")
    private_key, public_key = generate_keypair()
    save_private_key(private_key, private)
    save_public_key(public_key, public)
    return private, public
