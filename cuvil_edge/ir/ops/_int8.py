"""Python side of the native int8 kernels (``native_int8.c``): int8/uint8 convolution and matrix
products with int32 accumulation, stored as int32 or requantized in the same pass.

The quantized kernels (ConvInteger, QLinearConv in :mod:`.conv`; MatMulInteger, QLinearMatMul in
:mod:`.matmul`) call :func:`_i8_ops` inside ``if TARGET_NATIVE:`` and use :func:`conv` / :func:`matmul`
from what it returns; each returns None for a call it does not take (grouped or non-2-D convolutions,
per-row zero points, batched weights), and so does :func:`_i8_ops` where the library is missing or
``CUVIL_EDGE_NATIVE=0``: the numpy code runs instead, with the same results.

Weights are packed into the kernel's layout once per weight array: a read-only array (a package's
initializer) is packed on first use and the packing kept while the array lives (a weak reference,
checked with its address, shape and zero points, so a recycled ``id`` never matches); a writeable
array may change between calls, so it is packed on every call.
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

from cuvil_edge.ir.ops._native import library

#: native_int8.c's inner product, by cuvil_i8_path(): what the build of this machine chose.
PATHS = {0: "portable", 1: "avx2", 2: "vnni", 3: "sdot"}
_OUT = {np.dtype(np.int32): 0, np.dtype(np.uint8): 1, np.dtype(np.int8): 2}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "cuvil_i8_path": ((), _I),
    "cuvil_i8_packed_bytes": ((_I, _I), _I),
    "cuvil_i8_pack_a": ((_P, _I, _P, _I, _I, _I, _I, _I, _P), None),
    "cuvil_i8_conv2d": ((_P, _P, _I, _I) + (_I,) * 13 + (_P, _P, _I, _I, _I, _I, _I, _P, _I, _I), _I),
    "cuvil_i8_gemm": ((_P, _P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _I, _I, _I, _P, _I, _I), _I),
    "cuvil_i8_add": ((_P, _I, _P, _I, _I, _F, _F, _F, _F, _F, _F, _I, _P), None),
}

_packed: dict[int, tuple] = {}
_bound: dict[str, object] = {}
_lock = threading.Lock()


def _i8_ops():
    # the int8 kernels' module where the native library has them, else None (pasted into generated
    # modules, so it imports rather than closes over)
    from cuvil_edge.ir.ops import _int8

    return _int8 if _int8.lib() is not None else None


def lib():
    """The native library with the int8 functions bound, or None where it is unavailable."""
    native = library()
    if native is None or not hasattr(native, "cuvil_i8_path"):
        return None
    if not _bound:
        with _lock:
            for name, (argtypes, restype) in SIGNATURES.items():
                function = getattr(native, name)
                function.argtypes, function.restype = argtypes, restype
            _bound["lib"] = native
    return native


def path() -> str:
    """The inner product this machine's native build uses ('vnni', 'avx2', 'sdot', 'portable'), or
    'none' without the native library."""
    native = lib()
    return "none" if native is None else PATHS.get(int(native.cuvil_i8_path()), "portable")


def _zero_points(zp, count):
    """A weight zero point as int32 (length 1 or ``count``), or None for a shape the kernel does not take."""
    if zp is None:
        return np.zeros(1, np.int32)
    flat = np.ascontiguousarray(zp, dtype=np.int32).reshape(-1)
    return flat if flat.size in (1, count) else None


def _pack(native, w, zp, m, k, sm, sk):
    """The packed weight (a uint8 buffer) of A[r][c] = w.flat[r * sm + c * sk] with zero points ``zp``."""
    # the layout is the library's: a packing made by another build (another path) never matches
    sig = (id(native), w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str, zp.tobytes())
    cached = _packed.get(id(w)) if not w.flags.writeable else None
    if cached is not None and cached[0]() is w and cached[1] == sig:
        return cached[2]
    buf = np.empty(int(native.cuvil_i8_packed_bytes(m, k)) + 64, np.uint8)
    packed = buf[(-buf.ctypes.data) % 64 :][: buf.size - 64]
    src = np.ascontiguousarray(w)
    native.cuvil_i8_pack_a(
        src.ctypes.data, int(src.dtype == np.int8), zp.ctypes.data, zp.size, m, k, sm, sk, packed.ctypes.data
    )
    if not w.flags.writeable:
        key = id(w)
        _packed[key] = (weakref.ref(w, lambda _, key=key: _packed.pop(key, None)), sig, packed)
    return packed


def _requant(mult, m, out_dtype):
    if mult is None:
        return None, 0, 0, 0
    flat = np.ascontiguousarray(mult, dtype=np.float32).reshape(-1)
    if flat.size not in (1, m):
        return None, -1, 0, 0
    info = np.iinfo(out_dtype)
    return flat, flat.size, int(info.min), int(info.max)


def conv(x, x_zp, w, w_zp, bias, mult, y_zp, out_dtype, strides, pads, dilations, out, group):
    """2-D convolution (group 1) of int8/uint8 x and w: int32 (``mult`` None) or requantized to
    ``out_dtype`` with the per-channel ``mult`` and ``y_zp``; ``pads`` are (top, left, bottom, right),
    ``out`` the output size. None when the call is not one the kernel takes."""
    native = lib()
    if native is None or x.ndim != 4 or group != 1 or x.dtype not in (np.int8, np.uint8):
        return None
    if w.dtype not in (np.int8, np.uint8) or (x_zp is not None and np.size(x_zp) != 1):
        return None
    n, c, h, wd = x.shape
    m, k = w.shape[0], int(np.prod(w.shape[1:]))
    zp = _zero_points(w_zp, m)
    flat, mult_n, low, high = _requant(mult, m, out_dtype)
    if zp is None or mult_n < 0:
        return None
    y = np.empty((n, m) + tuple(out), dtype=out_dtype)
    packed = _pack(native, w, zp, m, k, k, 1)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.int32)
    xc = np.ascontiguousarray(x)
    xz = 0 if x_zp is None else int(np.asarray(x_zp).reshape(()))
    yz = 0 if y_zp is None else int(np.asarray(y_zp).reshape(()))
    plane, size = c * h * wd, out[0] * out[1]
    for i in range(n):
        code = native.cuvil_i8_conv2d(
            packed.ctypes.data,
            xc.ctypes.data + i * plane * xc.itemsize,
            int(xc.dtype == np.int8),
            xz,
            c,
            h,
            wd,
            w.shape[2],
            w.shape[3],
            strides[0],
            strides[1],
            pads[0],
            pads[1],
            dilations[0],
            dilations[1],
            out[0],
            out[1],
            None if b is None else b.ctypes.data,
            None if flat is None else flat.ctypes.data,
            mult_n,
            yz,
            low,
            high,
            _OUT[np.dtype(out_dtype)],
            y.ctypes.data + i * m * size * y.itemsize,
            size,
            1,
        )
        if code != 0:
            raise MemoryError("the native int8 convolution could not allocate its packed input")
    return y


def matmul(a, a_zp, b, b_zp, mult, y_zp, out_dtype):
    """``a @ b`` for int8/uint8 a (..., K) and a 2-D weight b (K, N): int32 or requantized as in
    :func:`conv`. None when the call is not one the kernel takes (a per-row zero point, b not 2-D)."""
    native = lib()
    if native is None or a.ndim < 2 or b.ndim != 2 or a.dtype not in (np.int8, np.uint8):
        return None
    if b.dtype not in (np.int8, np.uint8) or (a_zp is not None and np.size(a_zp) != 1):
        return None
    k, m = b.shape
    rows = int(np.prod(a.shape[:-1]))
    zp = _zero_points(b_zp, m)
    flat, mult_n, low, high = _requant(mult, m, out_dtype)
    if zp is None or mult_n < 0 or rows == 0:
        return None
    packed = _pack(native, b, zp, m, k, 1, m)
    ac = np.ascontiguousarray(a).reshape(rows, k)
    y = np.empty((rows, m), dtype=out_dtype)
    az = 0 if a_zp is None else int(np.asarray(a_zp).reshape(()))
    yz = 0 if y_zp is None else int(np.asarray(y_zp).reshape(()))
    code = native.cuvil_i8_gemm(
        packed.ctypes.data,
        ac.ctypes.data,
        int(ac.dtype == np.int8),
        az,
        rows,
        k,
        k,
        None,
        None if flat is None else flat.ctypes.data,
        mult_n,
        yz,
        low,
        high,
        _OUT[np.dtype(out_dtype)],
        y.ctypes.data,
        1,
        m,
    )
    if code != 0:
        raise MemoryError("the native int8 matrix product could not allocate its packed input")
    return y.reshape(a.shape[:-1] + (m,))


def add(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    """QuantizeLinear(DequantizeLinear(a) + DequantizeLinear(b)) of same-shaped int8/uint8 a and b,
    per-tensor parameters, in one pass; None for a call the kernel does not take."""
    native = lib()
    quant = (np.int8, np.uint8)
    if native is None or a.dtype not in quant or b.dtype not in quant or y_zp.dtype not in quant:
        return None
    ac, bc = np.ascontiguousarray(a), np.ascontiguousarray(b)
    y = np.empty(a.shape, dtype=y_zp.dtype)
    value = [float(np.asarray(v, dtype=np.float32).reshape(())) for v in (a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)]
    native.cuvil_i8_add(
        ac.ctypes.data,
        int(a.dtype == np.int8),
        bc.ctypes.data,
        int(b.dtype == np.int8),
        a.size,
        *value,
        int(y.dtype == np.int8),
        y.ctypes.data,
    )
    return y
