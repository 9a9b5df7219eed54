"""The native kernel library: ``native_kernels.c`` compiled on this machine by its own C compiler.

Kernels that have a native path read it through :func:`library` inside ``if TARGET_NATIVE:``
(a target capability the pruner keeps or removes) and fall back to their numpy code when it
returns None: no compiler, a failed compile, ``CUVIL_EDGE_NATIVE=0`` in the environment, or a
dtype or layout the C functions do not take. So a module built with the capability still runs
where the library is missing, only slower.

The shared object is cached per (source, compiler, flags, machine) under
``$CUVIL_EDGE_NATIVE_CACHE`` (default ``~/.cache/cuvil-edge/native``), written to a temporary
name and renamed, so concurrent first uses and a crash mid-compile never leave a half-written
library that a later process would load. A cold compile takes ~0.5 s once per machine.
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

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_kernels.c")
ABI_VERSION = 3

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


def _compile(compiler: str, folder: Path) -> Path | None:
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    errors = []
    for defines, libs in _VARIANTS:
        flags = _BASE_FLAGS + defines
        digest = hashlib.sha256(b"\0".join([source, version, " ".join(flags + libs).encode(),
                                            platform.machine().encode()])).hexdigest()[:24]
        target = folder / f"kernels-{digest}.so"
        if target.exists():
            return target
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temp = tempfile.mkstemp(prefix=".kernels-", suffix=".so", dir=folder)
        os.close(handle)
        try:
            done = subprocess.run([compiler, *flags, "-o", temp, str(SOURCE), *libs], capture_output=True,
                                  timeout=120)
            if done.returncode == 0:
                os.replace(temp, target)
                return target
            errors.append(done.stderr.decode(errors="replace")[-500:])
        except (OSError, subprocess.SubprocessError) as e:
            errors.append(str(e))
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
    logger.warning("native kernels did not compile with %s; numpy kernels run instead: %s", compiler, errors[-1:])
    return None


def _load() -> ctypes.CDLL | None:
    if os.environ.get("CUVIL_EDGE_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler on PATH: numpy kernels run instead of native ones")
        return None
    lib = None
    for attempt in range(2):
        path = None
        try:
            path = _compile(compiler, cache_dir())
            lib = ctypes.CDLL(str(path)) if path is not None else None
            break
        except OSError as e:  # a damaged cached library: remove it and compile once more
            logger.warning("cannot load the native kernels %s (%s)%s", path, e,
                           "; compiling again" if attempt == 0 else "; numpy kernels run instead")
            if path is not None and attempt == 0:
                path.unlink(missing_ok=True)
    if lib is None or lib.cuvil_abi_version() != ABI_VERSION:
        return None
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded native library, compiled on first use; None where it is unavailable."""
    try:
        return _state["lib"]  # type: ignore[return-value]
    except KeyError:
        pass
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _load()
    return _state["lib"]  # type: ignore[return-value]


def _native_lib():
    # the helper kernels call (pasted into generated modules, so it imports rather than closes over)
    from cuvil_edge.ir.ops._native import library
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
    lib.cuvil_epilogue_f32(y.ctypes.data, None if b is None else b.ctypes.data, planes, m, size, inner, code,
                           0.0 if activation == "relu" or activation == "relu6" else -np.inf,
                           6.0 if activation == "relu6" else np.inf)
    return True
