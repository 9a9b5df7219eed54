"""The native kernel library: ``native_*.c`` beside this file (``native_kernels.c`` and one file per
kernel family) compiled into one shared object on this machine by its own C compiler.

Kernels that have a native path read it through :func:`library` inside ``if TARGET_NATIVE:``
(a target capability the pruner keeps or removes) and fall back to their numpy code when it
returns None: no compiler, a failed compile, ``CUVIL_EDGE_NATIVE=0`` in the environment, or a
dtype or layout the C functions do not take. So a module built with the capability still runs
where the library is missing, only slower.

The shared object is cached per (source, compiler, flags, machine) under
``$CUVIL_EDGE_NATIVE_CACHE`` (default ``~/.cache/cuvil-edge/native``), written to a temporary
name and renamed, so concurrent first uses and a crash mid-compile never leave a half-written
library that a later process would load. A cold compile takes a few seconds of one core (3.7 CPU-s
for the five C files at -O3 on a 2.6 GHz EPYC), once per machine.

A library in the cache is code this process will run, so the cache is private
(:mod:`cuvil_edge.private_dir`): the folder is created 0700, and it or an entry that is a link,
another user's, or writable by group or others is refused (:class:`UnsafePathError`, raised by
:func:`library`: the message says what to fix). And each ``kernels-<digest>.so`` is used only when
``kernels-<digest>.so.hmac`` holds HMAC-SHA256 of its exact bytes under ``mac.key`` (32 random bytes,
0600, made in the cache on first use): the digest in the name is computable from public inputs, the
MAC is not, so a planted or damaged library is compiled again (a logged warning), never loaded. The
bytes that were checked are the ones loaded: they are read once, verified in memory, written to a
fresh private temporary file in the cache (0600, a random name) and ``ctypes.CDLL`` loads that file,
which is unlinked at once; so nothing can swap the library between the check and the load.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from cuvil_edge import private_dir
from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import UnsafePathError

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_kernels.c")
#: Every C file of the library, in a fixed order (the cache digest covers each one's bytes).
SOURCES = (SOURCE, *sorted(p for p in SOURCE.parent.glob("native_*.c") if p != SOURCE))
ABI_VERSION = 3
KEY_FILE = "mac.key"
MAC_SUFFIX = ".hmac"

_BASE_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd", "-fPIC", "-shared")
#: glibc on x86-64 ships vector erff/expf (libmvec); elsewhere the loops call the scalar functions.
_VARIANTS = ((("-DCUVIL_MVEC",), ("-lmvec", "-lm")), ((), ("-lm",)))

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "cuvil_abi_version": ((), _I),
    "cuvil_erf_f32": ((_P, _P, _I), None),
    "cuvil_gelu_f32": ((_P, _P, _I), None),
    "cuvil_sigmoid_f32": ((_P, _P, _I), None),
    "cuvil_layer_norm_f32": ((_P, _P, _P, _P, _I, _I, _F), None),
    "cuvil_epilogue_f32": ((_P, _P, _I, _I, _I, _I, _I, _F, _F), _I),
    "cuvil_swish_f32": ((_P, _P, _I, _F), None),
    "cuvil_softmax_f32": ((_P, _P, _I, _I), None),
    "cuvil_depthwise_conv2d_f32": ((_P, _P, _P, _P) + (_I,) * 16 + (_F, _F), _I),
    "cuvil_max_pool2d_f32": ((_P, _P) + (_I,) * 15, _I),
    "cuvil_gemm_blocking": ((_P,), None),
    "cuvil_gemm_pack_a_f32": ((_P, _P, _I, _I), None),
    "cuvil_conv_gemm_f32": ((_P,) * 6 + (_F, _F), _I),
    # native_fused.c: depthwise + pointwise in one call
    "cuvil_dwpw_mr": ((), _I),
    "cuvil_dwpw_pack_f32": ((_P, _P, _I, _I), None),
    "cuvil_dwpw_f32": ((_P,) * 8 + (_F,) * 4, _I),
}

_lock = threading.Lock()
_state: dict[str, object] = {}


def cache_dir() -> Path:
    """Where compiled libraries are kept."""
    configured = os.environ.get("CUVIL_EDGE_NATIVE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "cuvil-edge" / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _mac_parts(path: Path, data: bytes) -> tuple[bytes, ...]:
    """What a library's MAC covers: its file name (the variant) and its exact bytes."""
    return b"cuvil-edge native kernels", path.name.encode(), data


def _verified(path: Path, key: bytes) -> bytes | None:
    """The bytes of the cached library ``path`` if its MAC file authenticates them, else None.

    Raises:
        UnsafePathError: the library or its MAC file is a link, another user's, or writable by others.
    """
    data = private_dir.read_private(path, what="native kernel library")
    if data is None:
        return None
    stored = private_dir.read_private(path.with_name(path.name + MAC_SUFFIX), what="native kernel library MAC")
    try:
        tag = bytes.fromhex(stored.decode("ascii")) if stored is not None else None
    except ValueError:
        tag = None
    if private_dir.mac_matches(key, tag, *_mac_parts(path, data)):
        return data
    logger.warning(
        "native kernel library %s does not match its MAC (%s): not loaded, compiling it again",
        path,
        "missing" if stored is None else path.name + MAC_SUFFIX,
    )
    return None


def _build(
    compiler: str, flags: tuple[str, ...], libs: tuple[str, ...], folder: Path, errors: list[str]
) -> bytes | None:
    """The library compiled into a private temporary file of ``folder``: its bytes, or None (the
    compiler's complaint appended to ``errors``)."""
    handle, temp = tempfile.mkstemp(prefix=".kernels-", suffix=".so", dir=folder)
    os.close(handle)
    try:
        done = subprocess.run(
            [compiler, *flags, "-o", temp, *map(str, SOURCES), *libs], capture_output=True, timeout=120
        )
        if done.returncode == 0:
            return Path(temp).read_bytes()
        errors.append(done.stderr.decode(errors="replace")[-500:])
    except (OSError, subprocess.SubprocessError) as e:
        errors.append(str(e))
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return None


def _library_bytes(compiler: str, folder: Path) -> tuple[Path, bytes] | None:
    """The cache entry of this machine's library and its authenticated bytes: the cached library
    when its MAC verifies, else compiled now (MAC file first, then the library, each renamed into
    place); None where no variant compiles.

    Raises:
        UnsafePathError: the cache, its key or an entry read is not private (see the module docstring).
        OSError: the cache cannot be created or written.
    """
    private_dir.ensure_private_dir(folder, what="native kernel cache")
    key = private_dir.load_or_create_key(folder / KEY_FILE, what="native kernel cache key")
    source = b"\0".join(p.name.encode() + b"\0" + p.read_bytes() for p in SOURCES)
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    errors: list[str] = []
    for defines, libs in _VARIANTS:
        flags = _BASE_FLAGS + defines
        digest = hashlib.sha256(
            b"\0".join([source, version, " ".join(flags + libs).encode(), platform.machine().encode()])
        ).hexdigest()[:24]
        target = folder / f"kernels-{digest}.so"
        data = _verified(target, key)
        if data is None:
            data = _build(compiler, flags, libs, folder, errors)
            if data is None:
                continue
            tag = private_dir.mac(key, *_mac_parts(target, data))
            atomic_write(target.with_name(target.name + MAC_SUFFIX), tag.hex().encode() + b"\n", mode=0o600)
            atomic_write(target, data, mode=0o600)
        return target, data
    logger.warning("native kernels did not compile with %s; numpy kernels run instead: %s", compiler, errors[-1:])
    return None


def _open(folder: Path, data: bytes) -> ctypes.CDLL:
    """Load ``data`` (checked bytes) from a fresh private file, unlinked once loaded.

    Raises:
        OSError: the dynamic loader refused it.
    """
    handle, temp = tempfile.mkstemp(prefix=".load-", suffix=".so", dir=folder)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        return ctypes.CDLL(temp)
    finally:
        os.unlink(temp)


def _load() -> ctypes.CDLL | None:
    """The library, loaded; None where it is off, missing, or does not load.

    Raises:
        UnsafePathError: the cache is not private to this user (nothing in it was loaded).
    """
    if os.environ.get("CUVIL_EDGE_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler on PATH: numpy kernels run instead of native ones")
        return None
    folder = cache_dir()
    try:
        built = _library_bytes(compiler, folder)
        lib = _open(folder, built[1]) if built is not None else None
    except UnsafePathError as e:
        raise UnsafePathError(
            f"{e}; or point CUVIL_EDGE_NATIVE_CACHE at a private directory, or set "
            "CUVIL_EDGE_NATIVE=0 for the numpy kernels"
        ) from e
    except OSError as e:
        logger.warning("cannot build or load the native kernels in %s (%s); numpy kernels run instead", folder, e)
        return None
    if lib is None or lib.cuvil_abi_version() != ABI_VERSION:
        return None
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded native library, compiled on first use; None where it is unavailable.

    Raises:
        UnsafePathError: the native kernel cache is not private to this user (checked again on
            every call until it is fixed; nothing in it was loaded).
    """
    try:
        return _state["lib"]  # type: ignore[return-value]
    except KeyError:
        pass
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _load()
    return _state["lib"]  # type: ignore[return-value]


def _native_lib(_found={}):  # noqa: B006 - the dict is this function's cache, on purpose
    # the helper kernels call (pasted into generated modules, so it imports rather than closes
    # over); the import is done once per copy and kept in the default dict: an import statement
    # costs more than the rest of a small kernel's call
    library = _found.get("library")
    if library is None:
        from cuvil_edge.ir.ops._native import library

        _found["library"] = library
    return library()


def _native_map(x, name, *args):
    # the native elementwise function ``name`` over float32 x (a new array), or None where the
    # library or the dtype does not allow it and the numpy path runs instead
    lib = _native_lib() if x.dtype == np.float32 else None
    if lib is None:
        return None
    xc = np.ascontiguousarray(x)
    y = np.empty_like(xc)
    getattr(lib, name)(xc.ctypes.data, y.ctypes.data, xc.size, *args)
    return y


def _native_epilogue(y, bias, planes, m, size, inner, activation):
    # bias and activation in one pass over float32 y, in place (cuvil_epilogue_f32): the bias per
    # plane (b[row % m], a convolution's) or, with ``inner``, along each row (a Linear's). Returns
    # False, having done nothing, where the library is missing or the activation is not one it
    # has (HardSwish): the caller's numpy code runs instead.
    code = {"none": 0, "relu": 0, "relu6": 0, "sigmoid": 1, "swish": 2, "gelu": 3}.get(activation, -1)
    lib = _native_lib() if code >= 0 else None
    if lib is None:
        return False
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    lib.cuvil_epilogue_f32(
        y.ctypes.data,
        None if b is None else b.ctypes.data,
        planes,
        m,
        size,
        inner,
        code,
        0.0 if activation == "relu" or activation == "relu6" else -np.inf,
        6.0 if activation == "relu6" else np.inf,
    )
    return True
