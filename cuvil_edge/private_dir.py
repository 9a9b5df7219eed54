"""Private directories: the state directory and the code caches, which only the agent's user may write.

Layer 0, next to errors.py and atomic.py. A directory the agent keeps code or secrets in (its state
directory, the build cache, the native-library cache) is created 0700; one that exists is refused
(:class:`~cuvil_edge.errors.UnsafePathError`, naming the path and the fix) when it, or an entry the
agent reads from it (:func:`check_entries`: every entry directly in it), is a symbolic link, is owned
by another user than ``os.geteuid()``, or is writable by group or others (:func:`tighten_dir` makes
one of ours 0700 instead, for `agent init`). Key files must not be readable by them either. Every check uses
``lstat`` (a link is refused, never followed), and a file is read through a descriptor opened with
``O_NOFOLLOW`` whose ``fstat`` must be the file that was checked.

What is checked: the directory itself and the entries read from it, not its parents. A parent is the
operator's (a home directory, ``/var/lib``); the directories this module creates, missing parents
included, are created 0700.

The caches also authenticate what they hold: :func:`load_or_create_key` keeps a random 32-byte key
in a 0600 file (made once, atomically: the first writer wins), and :func:`mac` is HMAC-SHA256 under
it over length-prefixed parts. A cache entry is used only when its stored MAC verifies, so a file
rewritten by anyone who cannot read the key is rebuilt, never run.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

from cuvil_edge.atomic import fsync_dir
from cuvil_edge.errors import UnsafePathError

KEY_BYTES = 32
_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
_GROUP_OTHER_ANY = stat.S_IRWXG | stat.S_IRWXO


def _euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None  # no owners to compare on Windows


def check(
    path: Path, st: os.stat_result, *, what: str, directory: bool | None, secret: bool = False, disposable: bool = True
) -> None:
    """Refuse ``path`` (its ``lstat`` result ``st``) unless it is a real directory (``directory``
    True), a regular file (False) or either (None), owned by this process's effective user and not
    writable by group or others (``secret``: not readable by them either). ``disposable``: the
    message may advise removing it (a cache, made again); else only chmod/chown (a state directory).

    Raises:
        UnsafePathError: which of those it is not, and what to do.
    """
    mode = st.st_mode
    remove = f"remove it (`rm -r {path}`): it is made again" if disposable else "move it aside"
    if stat.S_ISLNK(mode):
        real = "directory" if directory else "file"
        raise UnsafePathError(
            f"{what} {path} is a symbolic link; cuvil-edge never follows links in its private "
            f"directories, nothing in it was used: replace it with the real {real}, or {remove}"
        )
    is_dir, is_file = stat.S_ISDIR(mode), stat.S_ISREG(mode)
    if (directory is True and not is_dir) or (directory is False and not is_file) or not (is_dir or is_file):
        want = {True: "a directory", False: "a regular file", None: "a directory or a regular file"}[directory]
        raise UnsafePathError(f"{what} {path} is not {want}; nothing in it was used: {remove}")
    euid = _euid()
    if euid is not None and st.st_uid != euid:
        first = f"{remove}, or" if disposable else "run the agent as its owner, or"
        raise UnsafePathError(
            f"{what} {path} is owned by uid {st.st_uid}, not by this agent's user (uid {euid}); "
            f"nothing in it was used: {first} if you trust its contents, `chown -R {euid} {path}`"
        )
    if mode & (_GROUP_OTHER_ANY if secret else _GROUP_OTHER_WRITE):
        tight = 0o700 if is_dir else 0o600
        problem = "readable or writable" if secret else "writable"
        raise UnsafePathError(
            f"{what} {path} is {problem} by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"nothing in it was used: `chmod {tight:o} {path}`"
            f"{' (or remove it)' if disposable else ''} and run again"
        )


def lstat(path: Path) -> os.stat_result | None:
    """``os.lstat(path)``, or None where nothing is there."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def ensure_private_dir(path: Path, *, what: str, disposable: bool = True) -> Path:
    """Create ``path`` 0700 (missing parents too), or check the directory that is there.

    Raises:
        UnsafePathError: it is a link, not a directory, another user's, or group/other-writable.
        OSError: it cannot be created.
    """
    path = Path(path)
    st = lstat(path)
    if st is None:
        missing = []
        for folder in (path, *path.parents):
            if lstat(folder) is not None:
                break
            missing.append(folder)
        for folder in reversed(missing):
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                continue  # made at the same moment by another process: checked below
            os.chmod(folder, 0o700)  # whatever the umask
        st = os.lstat(path)
    check(path, st, what=what, directory=True, disposable=disposable)
    return path


def tighten_dir(path: Path, *, what: str) -> bool:
    """Make an existing directory of ours 0700 (through a descriptor of the directory that was
    checked, so a swapped-in link is never followed); True when its mode changed.

    Raises:
        UnsafePathError: ``path`` is a link, not a directory, or another user's.
        OSError: it does not exist or cannot be changed.
    """
    path = Path(path)
    st = os.lstat(path)
    euid = _euid()
    if not stat.S_ISDIR(st.st_mode) or (euid is not None and st.st_uid != euid):
        check(path, st, what=what, directory=True, disposable=False)  # raises: a link, not a directory, not ours
    if not stat.S_IMODE(st.st_mode) & _GROUP_OTHER_ANY:
        return False
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafePathError(
                f"{what} {path} was replaced while it was being checked; check who else "
                "writes to its parent directory and run again"
            )
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return True


def check_entries(path: Path, *, what: str, disposable: bool = True) -> None:
    """Check every entry directly in ``path`` (not recursively) as :func:`check` does.

    Raises:
        UnsafePathError: the first entry that is a link, another user's, or group/other-writable.
    """
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # a temporary file another process just renamed or removed
                continue
            check(Path(entry.path), st, what=f"{what} entry", directory=None, disposable=disposable)


def read_private(path: Path, *, what: str, secret: bool = False) -> bytes | None:
    """The bytes of the regular file ``path`` after :func:`check`; None where it does not exist.

    Raises:
        UnsafePathError: it fails the check, or was replaced between the check and the read.
        OSError: it cannot be read.
    """
    st = lstat(path)
    if st is None:
        return None
    check(path, st, what=what, directory=False, secret=secret)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnsafePathError(
            f"{what} {path} changed while it was being read ({e.strerror}); "
            "check who else writes there, remove it and run again"
        ) from e
    with os.fdopen(fd, "rb") as f:
        opened = os.fstat(f.fileno())
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafePathError(
                f"{what} {path} was replaced while it was being read; check who else writes "
                "there, remove it and run again"
            )
        return f.read()


def load_or_create_key(path: Path, *, what: str) -> bytes:
    """The MAC key in ``path`` (0600, :data:`KEY_BYTES` random bytes), made on first use.

    Concurrent first uses agree: each writes a private temporary file and links it to ``path``,
    which never replaces an existing key, then every one reads the key that is there.

    Raises:
        UnsafePathError: the key file fails :func:`check` (``secret``), or is not a key.
        OSError: the key cannot be written or read.
    """
    path = Path(path)
    key = read_private(path, what=what, secret=True)
    if key is None:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
            os.close(fd)
            fd = -1
            try:
                os.link(temp, path)  # fails, leaving the first key, when another process made one
            except FileExistsError:
                pass
        finally:
            if fd >= 0:
                os.close(fd)
            os.unlink(temp)
        fsync_dir(path.parent)
        key = read_private(path, what=what, secret=True)
    if key is None or len(key) != KEY_BYTES:
        raise UnsafePathError(
            f"{what} {path} is not a {KEY_BYTES}-byte key; remove it (`rm {path}`): a new key "
            "is made and every entry it authenticated is rebuilt once"
        )
    return key


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under ``key`` over ``parts``, each prefixed by its length (so no two lists of
    parts authenticate the same bytes)."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def mac_matches(key: bytes, stored: bytes | None, *parts: bytes) -> bool:
    """Whether ``stored`` is :func:`mac` of ``parts`` (compared in constant time)."""
    return stored is not None and hmac.compare_digest(stored, mac(key, *parts))
