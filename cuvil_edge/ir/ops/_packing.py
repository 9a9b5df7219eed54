"""The native GEMM's side in Python: the blocking it was built with, weights packed into its
MR-row panels once per weight array, and the call k_conv makes (:func:`_native_conv_gemm`, pasted
into generated modules as a helper).

Packing happens lazily, once per weight array, keyed by the array's identity here, in this
process-wide table, not at module load and not in the build cache. The build cache is keyed by the
graph's structure (a new round's weights never regenerate code) and a module receives its weights
only as ``W`` on each ``run``, so there is no per-load hook without giving every compiled module
state; an identity key keeps the interpreter and every compiled module alike, costs one dict lookup
per call, and repacks exactly when a new package's arrays arrive. Only read-only arrays are kept
(a package's initializers are, :mod:`cuvil_edge.ir.graph`): one that may change in place is packed
per call. An entry holds a weak reference to its array and goes when the array does, so a
replaced round's weights do not stay packed.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

_packed: dict[int, tuple[weakref.ref, np.ndarray, int]] = {}
_shapes: dict[tuple, tuple[np.ndarray, int]] = {}
_lock = threading.Lock()
_blocking: dict[str, tuple[int, int, int, int]] = {}


def blocking(lib) -> tuple[int, int, int, int]:
    """(MR, NR, KC, NC) of the loaded library (NR depends on the ISA it was compiled for)."""
    if "b" not in _blocking:
        out = np.zeros(4, np.int64)
        lib.cuvil_gemm_blocking(out.ctypes.data)
        mr, nr, kc, nc = (int(v) for v in out)
        _blocking["b"] = (mr, nr, kc, nc)
    return _blocking["b"]


def gemm_panels() -> tuple[int, int]:
    """(MR, NR) of the native GEMM as this machine's library was built (AVX-512's when it is absent)."""
    from cuvil_edge.ir.ops._native import library  # lazily: the first call may compile it

    lib = library()
    return blocking(lib)[:2] if lib is not None else (6, 32)


def packed_conv_bytes(graph, types, large_scratch: bool) -> int:
    """Bytes of the packed copies the native GEMM keeps of ``graph``'s constant convolution
    weights (``types``: each value's runtime TensorType by name), held while the weights are."""
    from cuvil_edge.ir.ops._conv_path import conv_path, packed_weights_bytes

    total = 0
    for node in graph.nodes:
        if node.op_type in ("Conv", "CuvilFusedConv") and len(node.inputs) > 1 and node.inputs[1] in graph.initializers:
            x, w = types[node.inputs[0]], graph.initializers[node.inputs[1]]
            if (
                conv_path(
                    w.ndim - 2,
                    x.shape[1],
                    w.shape[0],
                    int(node.attr("group", 1)),
                    False,
                    False,
                    x.dtype == "float32",
                    large_scratch,
                    0,
                )
                == "native gemm"
            ):
                total += packed_weights_bytes(w.shape[0], w.size // max(w.shape[0], 1), gemm_panels()[0])
    return total


def _forget(key: int) -> None:
    with _lock:
        _packed.pop(key, None)


def packed_weights(lib, w: np.ndarray) -> tuple[np.ndarray, int]:
    """``w`` (M, ...) as the (M, K) matrix packed for ``lib.cuvil_conv_gemm_f32``, and its address
    (``.ctypes.data`` costs more than a dict lookup); packed once per read-only array (kept here
    while ``w`` lives), every call for a writable one (the caller holds the panels)."""
    key = id(w)
    hit = _packed.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1], hit[2]
    m = w.shape[0]
    k = w.size // m if m else 0
    mr = blocking(lib)[0]
    panels = np.empty(-(-m // mr) * mr * k, np.float32)
    wc = np.ascontiguousarray(w, dtype=np.float32)
    lib.cuvil_gemm_pack_a_f32(wc.ctypes.data, panels.ctypes.data, m, k)
    address = panels.ctypes.data
    if not w.flags.writeable:
        with _lock:
            _packed[key] = (weakref.ref(w, lambda _: _forget(key)), panels, address)
    return panels, address


def shape_vector(shape: tuple) -> int:
    """The address of ``shape`` as int64s, one array per distinct shape (at most a few hundred:
    the table is dropped when it grows past that, as a symbolic batch could make it)."""
    hit = _shapes.get(shape)
    if hit is None:
        if len(_shapes) > 512:
            _shapes.clear()
        vector = np.array(shape, np.int64)
        hit = _shapes[shape] = (vector, vector.ctypes.data)
    return hit[1]


def _native_conv_gemm(lib, x, w, b, st, pd, di, out, lo, hi, res=None):
    # a float32 2-D single-group convolution in C (native_gemm.c): the im2col'd input packed
    # straight into the GEMM's panels, the weights packed once, the bias, a residual of y's shape
    # and the clamp to [lo, hi] (Relu, Clip(0, 6), or none with -inf/inf) applied in the store;
    # y (n, m, *out)
    from cuvil_edge.ir.ops._packing import packed_weights, shape_vector

    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    y = np.empty((n, m) + tuple(out), dtype=np.float32)
    xc = np.ascontiguousarray(x)
    bc = None if b is None else np.ascontiguousarray(b, dtype=np.float32)
    rc = None if res is None else np.ascontiguousarray(res, dtype=np.float32)
    shape = shape_vector((n, c, h, wd, m, kh, kw, st[0], st[1], di[0], di[1], pd[0], pd[1], out[0], out[1]))
    panels, address = packed_weights(lib, w)  # panels: held for the call
    if (
        lib.cuvil_conv_gemm_f32(
            address,
            xc.ctypes.data,
            None if bc is None else bc.ctypes.data,
            None if rc is None else rc.ctypes.data,
            y.ctypes.data,
            shape,
            lo,
            hi,
        )
        != 0
    ):  # fallback: the library reports a failed allocation of its packed block as a typed error
        raise MemoryError("the native convolution could not allocate its packed input block")
    return y
