"""Crash-safe file replacement (PACKAGE_SPEC §11.3): temp file, fsync, rename, fsync directory.

Layer 0: every durable file cuvil-edge writes (state, caches, packages, keys) goes through here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new file.

    The temp file lives in the same directory (so ``os.replace`` is atomic) and
    gets ``mode`` before any data is written.

    Raises:
        OSError: the directory is not writable, the disk is full, ...
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry change (a rename) to disk.

    Raises:
        OSError: the directory cannot be opened.
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
