"""What a node's kernel does on a target: the work record the cost model (:mod:`cost_model`) prices.

The record mirrors the branches the build's kernel takes (``k_conv``'s paths by :func:`conv_path`,
``k_mat_mul``'s collapsed rows or batched products, the native C kernels where the target builds
them), and which family an op belongs to is its OpDef's to say: its ``cost_kind`` facet (one of
``ir.ops.COST_KINDS``), its ``cost_native`` facet (the shape of its float32 C kernel's work), its
``transcendental`` facet (an exp-class function per output element) and its ``view`` facet (no
bytes move). An op declaring none of them is one elementwise numpy pass. The int8 kernels' work is
:mod:`cost_int8`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuvil_edge.ir import dtypes, ops
from cuvil_edge.ir.graph import Node, TensorType
from cuvil_edge.ir.ops._activation import ACTIVATIONS
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._conv_path import conv_path, im2col_block_rows

#: Fused activations (the ``activation`` attribute of CuvilFused* nodes) that evaluate an exp-class
#: function per element: those whose op declares the ``transcendental`` facet.
TRANSCENDENTAL_ACTIVATIONS = frozenset(
    name for name, op in ACTIVATIONS.items() if op is not None and ops.get(op).transcendental
)
#: cost kinds of GEMM-like kernels (:func:`_matmul`) and of numpy normalisations (:func:`_normalization`)
_PRODUCT_KINDS = ("matmul", "fused matmul", "gemm", "conv transpose")
_NORMALIZATION_KINDS = ("normalization", "normalization affine", "normalization window")


@dataclass(frozen=True)
class Work:
    """What a kernel does: its products, Python-loop calls, memory traffic and native FLOPs."""

    kernel: str
    gemm: tuple[tuple[int, int, int, int], ...] = ()
    calls: int = 0  # numpy calls in Python loops beyond the first
    traffic: int = 0  # bytes moved beyond read + written + 2 x scratch (repeated passes)
    native: bool = False  # its arithmetic runs in the C kernels at native_gflops
    planes: int = 0  # image planes a native kernel pads and loops over, native_plane_us each
    exp_elements: int = 0  # exp-class function evaluations, transcendental_ns each
    rows: int = 0  # rows of a row-wise kernel (softmax rows, reduction outputs), row_ns each
    gathered: int = 0  # elements a window copy (im2col) moves, kernel_ns["gather"] each
    strided: bool = False  # the convolution has a stride > 1: kernel_ns["gather_strided"] per element
    native_calls: int = 0  # foreign calls beyond the first (an epilogue's activation), "native" overhead each
    reduced: int = 0  # input elements a numpy reduction reads, kernel_ns["reduce_element"] each
    layer_norm: int = 0  # elements the native LayerNorm normalises, kernel_ns["ln_element"] each
    depthwise: tuple | None = None  # native depthwise: (planes, (ph, pw), (oh, ow), taps, strided)
    products: int = 0  # np.matmul calls making the products (a batched call makes several); 0: one each
    pad_calls: int = 0  # numpy calls padding a window loop's input (np.full, the assignment), its counts' arrays
    np_pads: int = 0  # np.pad calls (AveragePool's count_include_pad window counts), kernel_overhead_us[NUMPY_PAD] each
    width: int = 0  # a native Softmax's row length (its remainder past the SIMD width runs scalar)
    pool: bool = False  # the native max pooling (its own measured terms, else the depthwise kernel's)


def work_of(node: Node, ins, outs, *, large: bool, native: bool) -> Work:
    """The kernel path ``node`` takes on a target (``large``: it has TARGET_LARGE_SCRATCH;
    ``native``: it builds the C kernels), by its op's cost facets, mirroring the kernels' branches."""
    op = ops.get(node.op_type, node.describe())
    kind = op.cost_kind
    if kind == "conv":
        return _conv(node, op, ins, outs, large, native)
    if kind in _PRODUCT_KINDS:
        return _matmul(node, op, kind, ins, outs, native)
    if op.view:
        return Work("view")
    fp32 = bool(ins) and ins[0] is not None and ins[0].dtype == "float32"
    exp = outs[0].numel() if op.transcendental and outs and outs[0] is not None else 0
    if op.cost_native and native and fp32 and (op.cost_native != "max pool" or ins[0].rank == 4):
        return _native(node, op, ins, outs, exp)
    if kind in _NORMALIZATION_KINDS:  # numpy's passes: each reads its operands and writes a new array
        passes, reductions, powers = _normalization_passes(node, kind)
        size = _bytes(ins[0])
        return Work(
            "normalization",
            calls=passes + reductions,
            traffic=3 * passes * size,
            reduced=reductions * ins[0].numel(),
            exp_elements=powers * ins[0].numel(),
        )
    if kind == "gather":
        return Work("gather")
    if kind == "reduce":
        # numpy's reduction sets up its inner loop per output element (GlobalAveragePool over
        # 1280 x 7 x 7: 87 ns per row, vs 29 for native Softmax rows: row_ns x 3 without reduce_row)
        return Work("reduce", rows=outs[0].numel(), reduced=ins[0].numel())
    if kind == "transpose":  # a strided copy: each element read from a different cache line
        return Work("transpose", traffic=2 * _bytes(outs[0]))
    if kind in ("window taps", "window taps counted"):
        return _window_taps(node, op, kind, ins, outs)
    # "int8 conv" / "int8 matmul" reach here only where cost_int8 does not take them: numpy's
    # int32 products, costed as a pass over the output like any other numpy kernel
    return Work("elementwise", exp_elements=exp)


def _native(node: Node, op: OpDef, ins, outs, exp: int) -> Work:
    """The float32 C kernel of an op with a ``cost_native`` facet."""
    if op.cost_native == "max pool":  # the strided depthwise kernel's loop: a padded plane, every tap per output row
        attrs = op.attrs(node)
        kernel, out = tuple(attrs["kernel_shape"]), tuple(outs[0].shape[2:])
        st, di = attrs.get("strides") or (1,) * len(kernel), attrs.get("dilations") or (1,) * len(kernel)
        padded_plane = tuple((o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out, st, di, kernel, strict=True))
        planes = math.prod(ins[0].shape[:2])
        return Work(
            "native",
            native=True,
            planes=planes,
            pool=True,
            depthwise=(planes, padded_plane, out, math.prod(kernel), True) if len(out) == 2 else None,
        )
    if op.cost_native == "layer norm":  # the C kernel's three passes per row, measured (kernel_ns ln_*)
        # its own kind: four arrays passed (x, scale, bias, y), each pointer read through .ctypes
        return Work(
            "native layer norm", native=True, rows=_rows(node, ins[0], from_axis=True), layer_norm=ins[0].numel()
        )
    rows = _rows(node, ins[0])
    width = ins[0].numel() // max(rows, 1) if op.cost_native == "softmax" else 0
    return Work("native", native=True, exp_elements=exp, rows=rows, width=width)


def _window_taps(node: Node, op: OpDef, kind: str, ins, outs) -> Work:
    """The numpy window loop: per tap a strided view and a ufunc pass; a padded input is first
    copied (np.full, the assignment); "window taps counted" (AveragePool) has a second tap loop
    counting each window's cells, then the division."""
    attrs = op.attrs(node)
    taps = math.prod(attrs["kernel_shape"])
    padded = any(attrs.get("pads") or ()) or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
    traffic = 2 * taps * _bytes(outs[0]) + 3 * padded * _bytes(ins[0])
    if kind == "window taps counted":
        include = bool(attrs.get("count_include_pad", 0))
        return Work(
            "numpy window taps",
            calls=2 * taps,
            traffic=traffic + 3 * _bytes(outs[0]),
            pad_calls=4 * padded + 4,
            np_pads=int(include),
        )
    return Work("numpy window taps", calls=taps, traffic=traffic, pad_calls=2 * padded)


def _conv(node: Node, op: OpDef, ins, outs, large: bool, native: bool) -> Work:
    """k_conv's branches, by :func:`conv_path`: native depthwise, native GEMM, 1x1 matmul, im2col
    whole or in blocks, numpy depthwise per tap, low-memory per-tap products; then the epilogue."""
    attrs = op.attrs(node)
    x, w, y = ins[0], ins[1], outs[0]
    n, c, m, kernel = x.shape[0], x.shape[1], w.shape[0], tuple(w.shape[2:])
    group, k, taps = int(attrs.get("group", 1)), len(kernel), math.prod(w.shape[2:])
    cg, mg, out = c // group, m // group, tuple(y.shape[2:])
    p, item = math.prod(out), 4 if x.dtype == "float16" else dtypes.itemsize(x.dtype)
    y_bytes = n * m * p * item
    padded = bool(any(attrs.get("pads") or ())) or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
    act = str(attrs.get("activation", "none"))
    exp = n * m * p if act in TRANSCENDENTAL_ACTIVATIONS else 0
    bias = len(ins) > 2 and ins[2] is not None
    epilogue = 2 * y_bytes * ((bias + (act != "none")) if not native or y.numel() < 1 << 15 else 1)
    calls, foreign = _epilogue_calls(bias, act, native and x.dtype != "float16", y.numel())
    strided = any(s != 1 for s in attrs.get("strides") or ())
    path = conv_path(
        k, c, m, group, max(kernel, default=1) == 1, padded, native and x.dtype == "float32", large, c * taps * p * item
    )
    if path == "native depthwise":
        st, di = attrs.get("strides") or (1, 1), attrs.get("dilations") or (1, 1)
        padded_plane = tuple((o - 1) * s + d * (kk - 1) + 1 for o, s, d, kk in zip(out, st, di, kernel, strict=True))
        # bias and Relu/Clip inside the C kernel; sigmoid/swish/GELU one more foreign call
        return Work(
            "conv depthwise native",
            native=True,
            planes=n * c,
            exp_elements=exp,
            depthwise=(n * c, padded_plane, out, taps, tuple(st) != (1, 1)),
            native_calls=int(act in TRANSCENDENTAL_ACTIVATIONS),
            calls=4 * (act == "hardswish"),
        )
    if path == "native gemm":  # im2col packing, bias and Relu/Clip in the C GEMM: costed as the sgemm
        return Work(
            "conv native gemm",
            ((m, c * taps, p, n),),
            exp_elements=exp,
            products=n,
            native_calls=int(act in TRANSCENDENTAL_ACTIVATIONS),
            calls=4 * (act == "hardswish"),
        )
    if path == "1x1 matmul":
        # a strided 1x1 reads every s-th pixel: the reshape copies that view (a strided gather)
        return Work(
            "conv 1x1 gemm",
            ((mg, cg, p, n * group),),
            traffic=epilogue,
            exp_elements=exp,
            calls=calls,
            native_calls=foreign,
            gathered=n * c * p if strided else 0,
            strided=strided,
            products=1,
        )
    if path == "depthwise taps":  # y += window * w per tap: the product written, then y read and written
        return Work(
            "conv depthwise taps",
            calls=2 * taps + calls,
            traffic=4 * taps * y_bytes + epilogue,
            exp_elements=exp,
            native_calls=foreign,
        )
    if path == "im2col blocks":  # each block's strided gather is one more read and write of its columns
        rows = im2col_block_rows(out[0], c * taps * out[1] * item)
        blocks = n * -(-out[0] // rows)
        return Work(
            "conv im2col blocks",
            ((m, c * taps, rows * out[1], blocks),),
            calls=2 * blocks + calls,
            traffic=2 * n * c * taps * p * item + epilogue,
            exp_elements=exp,
            gathered=n * c * taps * p,
            native_calls=foreign,
            strided=strided,
        )
    if path == "im2col":
        return Work(
            "conv im2col",
            ((mg, cg * taps, p, n * group),),
            traffic=epilogue,
            exp_elements=exp,
            gathered=n * c * taps * p,
            calls=calls,
            native_calls=foreign,
            strided=strided,
            products=1,
        )
    return Work(
        "conv per-tap gemm",
        ((mg, cg, p, n * group * taps),),
        calls=2 * taps + calls,
        traffic=2 * taps * y_bytes + epilogue,
        exp_elements=exp,
        native_calls=foreign,
        products=taps,
    )


def _matmul(node: Node, op: OpDef, kind: str, ins, outs, native: bool) -> Work:
    """By cost kind: "matmul", k_mat_mul (one product over collapsed rows when b is 2-D, else
    numpy's batched loop); "fused matmul", collapsed rows and the epilogue; "gemm", one product of
    transposable operands and the bias; "conv transpose", one product per kernel tap."""
    a, b, y = ins[0], ins[1], outs[0]
    act = str(op.attrs(node).get("activation", "none"))  # a fused node's; "none" for the others
    exp = y.numel() if act in TRANSCENDENTAL_ACTIVATIONS else 0
    if kind == "conv transpose":
        taps, group = math.prod(b.shape[2:]), int(node.attr("group", 1) or 1)
        return Work(
            "conv-transpose gemm",
            ((b.shape[1], b.shape[0] // group, math.prod(a.shape[2:]), a.shape[0] * group * taps),),
            calls=taps,
        )
    bias = len(ins) > 2 and ins[2] is not None
    if kind == "gemm":
        m, k = reversed(a.shape) if node.attr("transA", 0) else a.shape
        n = b.shape[0] if node.attr("transB", 0) else b.shape[1]
        calls, foreign = _epilogue_calls(bias, act, False, y.numel())
        return Work(
            "gemm", ((m, k, n, 1),), traffic=2 * _bytes(y) * bias, exp_elements=exp, calls=calls, native_calls=foreign
        )
    fused = kind == "fused matmul"
    if b.rank == 2 and (a.rank > 2 or fused):
        rows = math.prod(a.shape[:-1])
        epilogue = 2 * _bytes(y) if fused and bias else 0
        calls, foreign = _epilogue_calls(bias and fused, act, native and y.dtype == "float32", y.numel())
        return Work(
            "gemm rows collapsed",
            ((rows, a.shape[-1], b.shape[-1], 1),),
            traffic=epilogue,
            exp_elements=exp,
            calls=calls,
            native_calls=foreign,
        )
    m = a.shape[-2] if a.rank > 1 else 1
    n = b.shape[-1] if b.rank > 1 else 1
    count = math.prod(y.shape[:-2]) if y.rank > 2 else 1
    return Work("gemm batched" if count > 1 else "gemm", ((m, a.shape[-1], n, count),), products=1)


def _normalization_passes(node: Node, kind: str) -> tuple[int, int, int]:
    """(elementwise passes, reductions, exp-class evaluations per element) of a numpy normalisation
    kernel: "normalization", statistics by two reductions, then centring, scaling, the affine terms
    and the final astype as separate passes; "normalization affine" (given statistics), four passes;
    "normalization window" (LRN), one pass per channel tap and a power (a log and an exp)."""
    if kind == "normalization window":
        return 6 + int(node.attr("size", 5) or 5), 0, 2
    if kind == "normalization affine":
        return 4, 0, 0
    return 7, 2, 0


def _epilogue_calls(bias: bool, act: str, native: bool, size: int) -> tuple[int, int]:
    """(numpy calls, foreign calls) of a kernel's bias and activation epilogue: one native pass
    from 32k outputs, else an in-place add, Relu/Clip as one ufunc, sigmoid/swish/GELU as a
    foreign map (numpy's several passes without the native library), HardSwish in numpy."""
    if not bias and act == "none":
        return 0, 0
    if native and size >= 1 << 15 and act != "hardswish":
        return 0, 1
    calls = int(bias) + {"none": 0, "relu": 1, "relu6": 1, "hardswish": 4}.get(act, 0 if native else 5)
    return calls, int(native and act in TRANSCENDENTAL_ACTIVATIONS)


def _rows(node: Node, x: TensorType, from_axis: bool = False) -> int:
    """Rows a row-wise kernel loops over: the elements before its last axis, or (``from_axis``: a
    LayerNormalization) before its ``axis``."""
    # int(): a symbolic dim raises rather than multiplying as a string
    shape = tuple(int(d) for d in x.shape)
    if not from_axis:
        return math.prod(shape) // max(shape[-1], 1) if shape else 1
    axis = int(node.attr("axis", -1)) % len(shape) if shape else 0
    return math.prod(shape[:axis])


def _bytes(t: TensorType | None) -> int:
    return 0 if t is None else t.numel() * dtypes.itemsize(t.dtype)
