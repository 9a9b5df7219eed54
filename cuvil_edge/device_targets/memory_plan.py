"""Memory plan of a compiled module: its peak bytes, known before it runs (DESIGN.md §3, "Local build").

It walks the generated ``_forward``: nodes in graph order, a buffer freed when the module ``del``s
the last name reaching it (:func:`release_schedule`; a view op shares its input's buffer), inputs
held by the caller's ``feeds``, weights by ``W``. Peak = weights + max over steps of (live
activations + the kernel's transient *scratch*, one :data:`SCRATCH` row per kernel, checked against
tracemalloc in tests/device_targets/test_memory_plan.py) + :data:`OVERHEAD_BYTES`. Issue 12 bounds it
by weights + the two largest simultaneously-live activations + 10 % (:meth:`MemoryPlan.over_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cuvil_edge.device_targets.spec import TargetSpec, resolve
from cuvil_edge.errors import BuildError, CuvilError
from cuvil_edge.ir import dims, dtypes, ops
from cuvil_edge.ir.graph import Graph, Node, TensorType
from cuvil_edge.ir.ops._contract import no_scratch
from cuvil_edge.ir.ops._conv_path import conv_path, gemm_scratch_bytes, im2col_block_rows
from cuvil_edge.ir.ops._packing import gemm_panels, packed_conv_bytes

#: Python objects one run creates (frames, argument tuples, the feeds and outputs dicts): 1-4 KiB measured.
OVERHEAD_BYTES = 2048

#: Kernels returning a view of their first input (``reshape``, ``expand_dims``, the array itself):
#: no allocation, and the input's buffer lives as long as the view.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})

#: One ufunc: numpy's iterator buffers a block when an operand is broadcast (:meth:`Site.buffer`);
#: the binary elementwise ops declare the same rule on their OpDef (``broadcast_scratch``).
BROADCASTING = frozenset(
    {
        "Mod",
        "PRelu",
    }
)

#: Kernels that allocate their outputs only (one numpy call, or views then one copy), besides the
#: ops whose OpDef declares it (its ``scratch`` facet is ``no_scratch``).
NO_SCRATCH = frozenset(
    {
        *VIEW_OPS,
        "BitwiseNot",
        "Cast",
        "CastLike",
        "Transpose",
        "Expand",
        "Shape",
        "Size",
        "Concat",
        "Split",
        "Slice",
        "MatMul",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "ReduceMax",
        "ReduceSum",
        "ConstantOfShape",
        "Tile",
    }
)


@dataclass(frozen=True)
class Site:
    """What a scratch rule sees of one call: runtime types (batch bound, float16 applied) and the
    kernel paths the target takes (``large_scratch``: im2col; ``native``: the C kernels load)."""

    attrs: Mapping[str, Any]
    # TensorTypes whose dims are bound to ints (the batch substituted), None for an absent optional
    # input. Typed Any: TensorType's dims are int | str and its absence None, neither of which a
    # rule meets where it reads them (required inputs, bound dims), so the type cannot say it.
    ins: tuple[Any, ...]
    outs: tuple[Any, ...]
    large_scratch: bool
    native: bool

    out = property(lambda self: sum(self.nbytes(t) for t in self.outs))  # bytes of the outputs
    inp = property(lambda self: self.nbytes(self.ins[0]) if self.ins else 0)  # bytes of the first input

    @staticmethod
    def nbytes(t: TensorType | None) -> int:
        return 0 if t is None else t.numel() * dtypes.itemsize(t.dtype)

    def input(self, index: int) -> TensorType | None:
        return self.ins[index] if len(self.ins) > index else None  # None: an absent optional input

    def buffer(self, nbytes: int | None = None, item: int | None = None) -> int:
        """numpy's iterator buffer for a ufunc with a broadcast or strided operand writing ``nbytes``
        (default: the first input's size) of ``item``-byte elements (default: the first input's):
        one block of ``np.getbufsize()`` elements at most (8192 float32: 32 KiB, measured)."""
        item = item or dtypes.itemsize(self.ins[0].dtype)
        return min(self.inp if nbytes is None else nbytes, np.getbufsize() * item)


def _padded(x: Any, kernel, strides, pads, dilations, out, item: int, planes: bool = True) -> int:
    """Bytes of the padded copy ``_win_padded`` makes of ``x`` (a Site's bound type; the end pad
    grown for ceil_mode; none when nothing is padded); ``planes=False``: one plane, what a C
    kernel allocates (always)."""
    k, size, grown = len(kernel), math.prod(x.shape[:2]) if planes else 1, False
    for i in range(k):
        need = (out[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - x.shape[2 + i] - pads[i]
        size *= x.shape[2 + i] + pads[i] + max(pads[i + k], need)
        grown |= pads[i] > 0 or max(pads[i + k], need) > 0
    return size * item if grown or not planes else 0


def _window(s: Site, kernel) -> tuple[tuple, tuple, tuple, tuple]:
    """(strides, pads, dilations, out spatial) of a window op; SAME pads split as the kernels do."""
    k, x, out = len(kernel), s.ins[0], tuple(s.outs[0].shape[2:])
    strides, dilations = tuple(s.attrs.get("strides") or (1,) * k), tuple(s.attrs.get("dilations") or (1,) * k)
    pads = tuple(s.attrs.get("pads") or (0,) * (2 * k))
    if s.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        total = [
            max(0, (out[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - x.shape[2 + i]) for i in range(k)
        ]
        pads = tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)
    return strides, pads, dilations, out


def _activation(kind: str, out: int, native: bool) -> int:
    """Bytes ``_activate(y, kind)`` holds beside y and its result (_activation.py, unary.py)."""
    if kind in ("none", "relu", "relu6") or (native and kind in ("sigmoid", "gelu", "swish")):
        return 0
    # numpy sigmoid: e, the mask (1 byte/element), 1/(1+e), e/(1+e), np.where's result before astype;
    # numpy GELU: float64 copies and _erf64's temporaries (data-dependent: 74-115 B/element measured)
    # numpy swish: alpha x, e, the mask, the two quotients, np.where's result, the product
    return {"hardswish": out, "sigmoid": 13 * out // 4, "swish": 21 * out // 4}.get(kind, 20 * out)


def _conv(s: Site) -> int:
    """k_conv, by :func:`conv_path`: native depthwise (C: one padded plane and an accumulator);
    native GEMM (C: one packed block of im2col columns); 1x1 as one matmul; im2col, in cache-sized
    blocks of output rows when the whole would pass 2 MiB or the target has little memory (2-D, one
    group); numpy depthwise per tap; else one matmul per tap (low memory). Then the bias added in
    place (numpy's broadcast buffer) and the activation, a new array."""
    x, w = s.ins[0], s.ins[1]
    kernel, group, kind = tuple(w.shape[2:]), int(s.attrs.get("group", 1)), str(s.attrs.get("activation", "none"))
    strides, pads, dilations, out_sp = _window(s, kernel)
    wide = 4 if x.dtype == "float16" else dtypes.itemsize(x.dtype)  # float16 is computed in float32
    n, c, m, p, taps = x.shape[0], x.shape[1], w.shape[0], math.prod(out_sp), math.prod(kernel)
    y, block = n * m * p * wide, s.buffer(n * m * p * wide, wide)
    path = conv_path(
        len(kernel),
        c,
        m,
        group,
        max(kernel, default=1) == 1,
        any(pads),
        s.native and x.dtype == "float32",
        s.large_scratch,
        c * taps * p * wide,
    )
    if path == "native depthwise":
        plane = _padded(x, kernel, strides, pads, dilations, out_sp, 4, planes=False)
        tail = (kernel[1] - 1) * dilations[1] * 4
        flat = all(st == 1 for st in strides)  # the accumulator spans the padded width
        acc = (out_sp[0] * plane // (4 * (out_sp[0] + dilations[0] * (kernel[0] - 1))) if flat else out_sp[1]) * 4
        return plane + tail + acc + (y + _activation(kind, y, True) if kind == "hardswish" else 0)
    if path == "native gemm":  # the packed weights are held for the module's life: runtime weights
        return max(
            gemm_scratch_bytes(c, x.shape[2:], kernel, strides, pads, dilations, out_sp, gemm_panels()[1]),
            y + _activation(kind, y, True) if kind == "hardswish" else 0,
        )  # the block is freed first
    held = (x.numel() + w.numel()) * wide if wide != dtypes.itemsize(x.dtype) else 0  # float32 copies
    if path == "1x1 matmul":
        main = y + (n * c * p * wide if any(st != 1 for st in strides) else 0)  # reshape copies a strided x
    elif path != "per-tap gemm":
        held += _padded(x, kernel, strides, pads, dilations, out_sp, wide) if any(pads) else 0
        if path == "depthwise taps":
            main = 2 * y + block  # y and one broadcast-scaled window per tap
        elif path == "im2col blocks":  # one block of output rows' columns, about 1 MiB
            rows = im2col_block_rows(out_sp[0], c * taps * out_sp[1] * wide)
            held += c * taps * rows * out_sp[1] * wide
            main = y
        else:
            held += n * c * taps * p * wide  # the im2col copy, bound to a local
            main = y
    else:
        held += _padded(x, kernel, strides, pads, dilations, out_sp, wide)  # the last tap's view keeps it
        main = 2 * y + n * c * p * wide  # y, one tap's window copied by reshape, its matmul product
    if s.native and wide == 4 and x.dtype in ("float32", "float16") and kind != "hardswish" and y >= 4 << 15:
        tail = y  # bias and activation in one native pass, in place
    else:
        tail = y + block if s.input(2) is not None else y  # the bias added in place
        if kind != "none":  # Relu and relu6 in place; the others a new array
            tail = max(tail, (y if kind in ("relu", "relu6") else 2 * y) + _activation(kind, y, s.native))
    if wide != dtypes.itemsize(x.dtype):
        tail = max(tail, y + s.out)  # the final astype to float16
    return held + max(main, tail) - s.out


def _gemm(s: Site) -> int:
    """k_gemm: a@b, scaled by alpha and shifted by c*beta in place (c broadcast through numpy's
    buffer), then the activation (Relu and relu6 in place, the others a new array)."""
    c, y, kind = s.input(2), s.out, str(s.attrs.get("activation", "none"))
    phases = [y]
    if c is not None:
        scaled = s.nbytes(c) if s.attrs.get("beta", 1.0) != 1.0 else 0
        phases.append(y + scaled + (s.buffer(y) if c.numel() not in (1, s.outs[0].numel()) else 0))
    if kind != "none":
        phases.append((y if kind in ("relu", "relu6") else 2 * y) + _activation(kind, y, s.native))
    return max(phases) - y


def _fused_mat_mul(s: Site) -> int:
    """k_fused_mat_mul: one product, then the bias (broadcast through numpy's buffer) and the
    activation in place, or both in one native pass from 32k float32 outputs."""
    y, kind, bias = s.out, str(s.attrs.get("activation", "none")), s.input(2)
    if (
        s.native
        and s.outs[0].dtype == "float32"
        and kind != "hardswish"
        and (bias is not None or kind != "none")
        and s.outs[0].numel() >= 1 << 15
    ):
        return 0
    phases = [y, y + s.buffer(y)] if bias is not None else [y]
    if kind != "none":
        phases.append((y if kind in ("relu", "relu6") else 2 * y) + _activation(kind, y, s.native))
    return max(phases) - y


def _pool(s: Site, average: bool) -> int:
    """MaxPool: native, one padded plane; numpy, the padded input (the last tap's view keeps it)
    and a block buffered for the strided taps. AveragePool: also the total before the division."""
    kernel, x = tuple(s.attrs["kernel_shape"]), s.ins[0]
    strides, pads, dilations, out_sp = _window(s, kernel)
    if s.attrs.get("indices"):
        return 6 * s.out  # np.where per tap: y, index and their replacements
    if s.native and not average and len(kernel) == 2 and x.dtype == "float32":
        return _padded(x, kernel, strides, pads, dilations, out_sp, 4, planes=False)
    padded = _padded(x, kernel, strides, pads, dilations, out_sp, dtypes.itemsize(x.dtype))
    return padded + s.buffer(s.out) + (s.out if average else 0)  # np.maximum(y, tap, out=y) buffers too


def _conv_transpose(s: Site) -> int:
    """k_conv_transpose: y over the taps' full span, one product per tap (every tap at once with
    large scratch), then the bias add or the copy of a cropped span."""
    x, w, y, k = s.ins[0], s.ins[1], s.outs[0], s.ins[0].rank - 2
    kernel, item, pads = tuple(w.shape[2:]), dtypes.itemsize(x.dtype), tuple(s.attrs.get("pads") or (0,) * 2 * k)
    st, di = tuple(s.attrs.get("strides") or (1,) * k), tuple(s.attrs.get("dilations") or (1,) * k)
    span = (
        y.shape[0]
        * y.shape[1]
        * item
        * math.prod(
            max(pads[i] + y.shape[2 + i], (x.shape[2 + i] - 1) * st[i] + di[i] * (kernel[i] - 1) + 1) for i in range(k)
        )
    )
    per_tap = x.shape[0] * int(s.attrs.get("group", 1)) * w.shape[1] * math.prod(x.shape[2:]) * item
    cols, bias = per_tap * math.prod(kernel) if s.large_scratch else 0, s.input(2) is not None
    copied = bias or span != s.out
    last = span + cols + (s.out + (s.buffer(s.out) if bias else 0) if copied else 0)
    return max(span + (cols or per_tap), last) - (s.out if copied else span)


def _resize(s: Site, every_axis: bool = False) -> int:
    """k_resize (nearest): one np.take per resized axis, each result alive while the next is made;
    ``every_axis``: k_upsample, which takes along every axis, then copies with astype (linear: in
    float64, each axis holding its input, its float64 copy, three products and a broadcast block)."""
    x, y = s.ins[0], s.outs[0]
    shape, sizes, linear = list(x.shape), [], bool(s.attrs.get("linear"))
    for axis in range(x.rank):
        if every_axis or y.shape[axis] != x.shape[axis]:
            shape[axis] = y.shape[axis]
            sizes.append(math.prod(shape) * (8 if linear else dtypes.itemsize(y.dtype)))
    if linear:
        sources = [x.numel() * 8] + sizes[:-1]  # out.astype(float64) copies its input at every axis
        return max(
            [p + (p if i else 0) + 3 * e + s.buffer(e, 8) for i, (p, e) in enumerate(zip(sources, sizes, strict=True))]
            + [sizes[-1]]
        )  # the last float64 result beside the output's astype copy
    phases = [a + b for a, b in zip(sizes, sizes[1:], strict=False)] or sizes or [s.out]
    return max(phases + [sizes[-1] + s.out] * every_axis) - s.out


#: op type -> bytes of transient workspace a call holds beyond its live inputs and its outputs.
#: Each row is read from the kernel's source in cuvil_edge/ir/ops/: when a kernel changes, change its row.
def _native_softmax(s: Site) -> bool:
    """k_softmax's C path: float32, normalising the trailing dims (legacy, or the last axis)."""
    rank, axis = len(s.ins[0].shape), int(s.attrs.get("axis", -1))
    return s.native and s.ins[0].dtype == "float32" and (bool(s.attrs.get("legacy")) or axis % rank == rank - 1)


def _native_layer_norm(s: Site) -> bool:
    """k_layer_normalization's C path: float32, one output, scale (and bias) of the normalised size."""
    x, rank = s.ins[0], len(s.ins[0].shape)
    size = math.prod(x.shape[int(s.attrs.get("axis", -1)) % rank :]) if rank else 1
    bias = s.input(2)
    return (
        s.native
        and x.dtype == "float32"
        and len(s.outs) == 1
        and s.attrs.get("stash") != "float64"
        and s.ins[1].numel() == size
        and (bias is None or bias.numel() == size)
    )


SCRATCH: dict[str, Callable[[Site], int]] = {
    # one ufunc: a block buffered when an operand is broadcast (neither one element nor the output's size)
    **{
        op: lambda s: s.buffer(s.out) * any(t is not None and t.numel() not in (1, s.outs[0].numel()) for t in s.ins)
        for op in BROADCASTING
    },
    "Conv": _conv,
    "CuvilFusedMatMul": _fused_mat_mul,
    "CuvilFusedConv": _conv,
    "CuvilConvAdd": _conv,  # the residual is added in place (in the native GEMM's store)
    "Gemm": _gemm,
    "CuvilFusedGemm": _gemm,
    "MaxPool": lambda s: _pool(s, False),
    "AveragePool": lambda s: _pool(s, True),
    "ConvTranspose": _conv_transpose,
    "Resize": _resize,
    "Upsample": lambda s: _resize(s, every_axis=True),
    # x - max (broadcast) lives while exp makes e; then e / sum (broadcast)
    "Softmax": lambda s: 0 if _native_softmax(s) else s.inp + s.buffer(),  # e, then divided in place
    "LogSoftmax": lambda s: 2 * s.inp + s.buffer(),
    # x.astype(stash) copies (float32 to float32 too), centred; then centred*inv, its astype copy,
    # *scale, +bias: four input-sized arrays at once, plus a broadcast block
    "LayerNormalization": lambda s: 0 if _native_layer_norm(s) else 3 * s.inp + s.buffer(),
    "BatchNormalization": lambda s: s.out + s.buffer(),
    # w - mean, its square; w - mean, / std, * scale, + bias, astype: two input-sized arrays at once
    "InstanceNormalization": lambda s: s.inp + s.buffer(),
    # np.pad(x**2) over channels, the running window sum and its products before the astype copy
    "LRN": lambda s: s.inp * (s.ins[0].shape[1] + int(s.attrs.get("size", 1)) - 1) // s.ins[0].shape[1] + 2 * s.inp,
    # np.maximum then np.minimum: the first result lives while the second is made
    "Clip": lambda s: s.out if s.input(1) is not None and s.input(2) is not None else 0,
    # x.mean(...), then .astype(x.dtype) copies the (small) result
    "ReduceMean": lambda s: s.out,
    # np.where over the int64 indices before np.take
    "Gather": lambda s: 24 * (s.ins[1].numel() if s.input(1) is not None else 0),
    # float32 in C: the output only; numpy _erf64: float64 copies and per-range temporaries,
    # data-dependent (63-103 B/element measured on N(0, 0.1..10)), GELU adds its float64 products
    "Erf": lambda s: 0 if s.native and s.ins[0].dtype == "float32" else 70 * s.ins[0].numel(),
    "Gelu": lambda s: 0 if s.native and s.ins[0].dtype == "float32" else 80 * s.ins[0].numel(),
    "Sigmoid": lambda s: _activation("sigmoid", s.out, s.native and s.ins[0].dtype == "float32"),
    "HardSwish": lambda s: _activation("hardswish", s.out, s.native),
    "Swish": lambda s: _activation("swish", s.out, s.native and s.ins[0].dtype == "float32"),
    # bytes.fromhex makes the data once more before np.frombuffer(...).copy()
    "Constant": lambda s: s.out,
}


@dataclass(frozen=True)
class Step:
    """One call (or a step of the module's wrapper), in bytes; peak = live + scratch."""

    index: int
    node: str
    op_type: str
    live_bytes: int  # activations alive during the call, its new outputs included
    scratch_bytes: int
    after_bytes: int  # alive once the module has deleted what this node read last
    estimated: bool  # the op has no SCRATCH row: one output-sized temporary assumed
    peak_bytes = property(lambda self: self.live_bytes + self.scratch_bytes)


@dataclass(frozen=True)
class MemoryPlan:
    """Planned memory of one build, in bytes: ``peak_bytes`` = weights (+ float16 copies, + the
    native GEMM's packed weights) + the worst step + :data:`OVERHEAD_BYTES`."""

    graph: str
    target: str
    precision: str
    batch: int
    low_memory: bool  # the target lacks TARGET_LARGE_SCRATCH: kernels take their low-memory paths
    native: bool  # the plan assumes the C kernels load
    weights_bytes: int  # the package's initializers (the caller holds them as W)
    runtime_weights_bytes: int  # copies the module makes each run (float16 builds cast W)
    steps: tuple[Step, ...]
    peak_bytes: int
    peak_step: int
    largest_live: tuple[tuple[str, int], ...]  # the two largest simultaneously-live activations
    packed_weights_bytes: int = 0  # the native GEMM's packed copies of weights, made once, held with them

    @property
    def bound_bytes(self) -> int:
        """Weights (and their packed copies) plus the two largest simultaneously-live activations: a
        floor the plan is compared with, so that ``over_bound`` can name the steps that need far more
        than it."""
        return self.weights_bytes + self.packed_weights_bytes + sum(size for _, size in self.largest_live)

    def over_bound(self, slack: float = 0.10) -> tuple[Step, ...]:
        """The steps whose planned peak exceeds the bound by more than ``slack``, worst first."""
        room = self.bound_bytes * (1 + slack) - self.weights_bytes - self.runtime_weights_bytes - OVERHEAD_BYTES
        room -= self.packed_weights_bytes
        return tuple(sorted((s for s in self.steps if s.peak_bytes > room), key=lambda s: -s.peak_bytes))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field (steps as dicts) and the bound."""
        return {**asdict(self), "largest_live": [list(p) for p in self.largest_live], "bound_bytes": self.bound_bytes}

    def describe(self) -> str:
        """A few lines for a build report."""
        mb = lambda b: f"{b / 2**20:.3f} MiB"  # noqa: E731
        w = self.steps[self.peak_step] if self.steps else Step(0, "-", "-", 0, 0, 0, False)
        kernels = ", low-memory kernels" * self.low_memory + ", native kernels" * self.native
        over, guessed = self.over_bound(), sorted({s.op_type for s in self.steps if s.estimated})
        weights = self.weights_bytes + self.runtime_weights_bytes + self.packed_weights_bytes
        largest = " + ".join(f"{n!r} {mb(b)}" for n, b in self.largest_live)
        return "\n".join(
            [
                f"memory plan for {self.graph!r} on {self.target} "
                f"({self.precision}, batch {self.batch}{kernels}): peak "
                f"{mb(self.peak_bytes)} = weights {mb(weights)} + live "
                f"{mb(w.live_bytes)} + scratch {mb(w.scratch_bytes)} at {w.node!r} ({w.op_type})",
                f"bound: weights + {largest} = {mb(self.bound_bytes)}",
                *(
                    [
                        "over the bound + 10 %: "
                        + ", ".join(f"{s.node!r} ({s.op_type}, scratch {mb(s.scratch_bytes)})" for s in over[:5])
                    ]
                    if over
                    else []
                ),
                *([f"scratch estimated (no SCRATCH row): {', '.join(guessed)}"] if guessed else []),
            ]
        )


def release_schedule(graph: Graph) -> list[list[str]]:
    """Per node, the value names the generated ``_forward`` deletes right after it: outputs nobody
    reads and the inputs it reads last, graph outputs excepted (codegen._forward_source's rule)."""
    last_use = {name: index for index, node in enumerate(graph.nodes) for name in node.inputs if name}
    keep = {v.name for v in graph.outputs}
    schedule = []
    for index, node in enumerate(graph.nodes):
        dead = [o for o in node.outputs if o and o not in keep and o not in last_use]
        dead += [i for i in dict.fromkeys(node.inputs) if i and last_use.get(i) == index and i not in keep]
        schedule.append(list(dict.fromkeys(dead)))
    return schedule


def plan_memory(
    graph: Graph, target: TargetSpec | str, *, precision: str = "fp32", batch: int = 1, native: bool | None = None
) -> MemoryPlan:
    """Plan the peak memory of ``graph`` compiled for ``target``, run on ``batch`` samples.

    ``native``: whether the C kernels load where the module runs (None: the target has them and
    they load in this process, as they would for the module).

    Raises:
        UnknownTargetError, TargetSpecError: ``target`` names no valid spec.
        TargetError: the target does not support ``precision``.
        BuildError: ``batch`` is not a positive int (or not 1 for a graph without a batch dim), the
            inputs lead with several symbols, a value keeps a symbolic dim other than the batch, or
            a node's attributes are invalid.
    """
    spec = resolve(target)
    caps = spec.capabilities(precision)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise BuildError(f"batch must be a positive int, got {batch!r}")
    leading = {
        name
        for v in graph.inputs
        if v.type.shape and isinstance(v.type.shape[0], str)
        for name in dims.symbols_of(v.type.shape[0])
    }
    if len(leading) > 1:
        raise BuildError(
            f"graph {graph.name!r} inputs lead with several symbols {sorted(leading)}; the memory plan "
            "binds one batch symbol. Export the model with one batch axis shared by its inputs"
        )
    symbol = leading.pop() if leading else None
    if symbol is None and batch != 1:
        raise BuildError(f"graph {graph.name!r} has no symbolic batch dim (its inputs fix it); plan with batch=1")
    fp16, static = bool(caps["COMPUTE_FP16"]), bool(spec.static_shapes and symbol)
    if native is None:  # as the module will: the C kernels when the target has them and they load here
        try:
            from cuvil_edge.ir.ops._native import library  # lazily: the first call may compile them

            native = bool(caps.get("TARGET_NATIVE")) and library() is not None
        except ImportError:  # a tree without the native kernels
            native = False
    step = spec.static_batch if static else batch  # static-shape targets run fixed-size chunks
    bind = lambda size: {symbol: size} if symbol else {}  # noqa: E731
    full, types = _Types(graph, bind(batch), False), _Types(graph, bind(step), fp16)
    chunks, out_step = -(-batch // step), sum(types.bytes(v.name) for v in graph.outputs)
    held = 0  # bytes outside _forward's values: the caller's inputs when the wrapper feeds new arrays
    if fp16 or static:
        held = sum(full.bytes(v.name) for v in graph.inputs) + (chunks - 1) * out_step
        held += sum(_Types(graph, bind(batch), True).bytes(v.name) for v in graph.inputs) if fp16 and static else 0
        held -= sum(types.bytes(v.name) for v in graph.inputs) if static and batch % step == 0 else 0  # views
    steps, pair = _simulate(graph, types, bool(caps["TARGET_LARGE_SCRATCH"]), native, held)
    last = steps[-1].after_bytes if steps else held + sum(types.bytes(v.name) for v in graph.inputs)
    wrapper = [("(static batch) concatenate chunks", held + (chunks + 1) * out_step)] * static
    wrapper += [("(float16) cast outputs to float32", last + sum(full.bytes(v.name) for v in graph.outputs))] * fp16
    steps += [
        Step(len(steps) + i, name, "(module wrapper)", live, 0, live, False) for i, (name, live) in enumerate(wrapper)
    ]
    copies = sum(int(a.size) * 2 for a in graph.initializers.values() if fp16 and a.dtype == np.float32)
    worst = max(range(len(steps)), key=lambda i: steps[i].peak_bytes, default=0)
    packed = packed_conv_bytes(graph, types, bool(caps["TARGET_LARGE_SCRATCH"])) if native else 0
    weights = graph.parameter_bytes()
    peak = weights + copies + packed + (steps[worst].peak_bytes if steps else last) + OVERHEAD_BYTES
    return MemoryPlan(
        graph.name,
        spec.name,
        precision,
        batch,
        not caps["TARGET_LARGE_SCRATCH"],
        native,
        weights,
        copies,
        tuple(steps),
        peak,
        worst,
        pair,
        packed,
    )


class _Types(dict):
    """Runtime types by value name ("" for an absent input): the batch bound; float32 is float16 when
    the module computes in float16.

    Raises:
        BuildError: a dim stays symbolic once the batch is bound.
    """

    def __init__(self, graph: Graph, bindings: Mapping[str, int], fp16: bool) -> None:
        super().__init__({"": None})
        for name, t in graph.types.items():
            if not (t := t.bind(bindings)).is_static:
                raise BuildError(
                    f"value {name!r} of graph {graph.name!r} has shape {list(t.shape)}: a dim is neither fixed nor "
                    f"the batch ({', '.join(bindings) or 'none'}), so its size is unknown before running. Give "
                    "the largest size of each such axis in the site's limits.dims (e.g. {seq: 128}), or "
                    "export the model with that axis fixed"
                )
            self[name] = TensorType("float16", t.shape) if fp16 and t.dtype == "float32" else t

    def bytes(self, name: str) -> int:
        return Site.nbytes(self[name])


def _scratch(node: Node, types: _Types, large: bool, native: bool) -> tuple[int, bool]:
    """(scratch bytes of ``node``'s call, whether estimated).

    Raises:
        BuildError: the node's attributes cannot be read, or its SCRATCH row does not fit it.
    """
    if node.op_type in NO_SCRATCH:
        return 0, False
    op = ops.get(node.op_type, node.describe())
    if op.scratch is no_scratch:
        return 0, False
    try:
        attrs = op.attrs(node)
        site = Site(attrs, tuple(types[i] for i in node.inputs), tuple(types[o] for o in node.outputs), large, native)
        rule = op.scratch or SCRATCH.get(node.op_type)  # the op's own facet first
        return (max(0, int(rule(site))), False) if rule else (site.out, True)
    except CuvilError:
        raise
    except Exception as e:  # a row that does not fit this node must name it
        raise BuildError(f"memory plan of {node.describe()} failed: {type(e).__name__}: {e}") from e


def _simulate(
    graph: Graph, types: _Types, large: bool, native: bool, held: int
) -> tuple[list[Step], tuple[tuple[str, int], ...]]:
    """The steps of ``_forward``, tracking live buffers; and the two buffers alive together whose
    sum is largest, as (value name, bytes)."""
    pinned = {v.name for v in graph.inputs}  # the caller's feeds hold them
    owner: dict[str, str | None] = {**{k: None for k in graph.initializers}, **{k: k for k in pinned}}
    size, names = {k: types.bytes(k) for k in pinned}, {k: 1 for k in pinned}  # per buffer: bytes, names reaching it
    live, steps = sum(size.values()), []
    pair = tuple(sorted(size.items(), key=lambda kv: -kv[1])[:2])
    for index, (node, dead) in enumerate(zip(graph.nodes, release_schedule(graph), strict=True)):
        for position, out in enumerate(node.outputs):
            if out and node.op_type in VIEW_OPS and position == 0 and node.inputs and node.inputs[0]:
                base = owner[out] = owner.get(node.inputs[0])
                if base is not None:
                    names[base] += 1
            elif out:
                owner[out], size[out], names[out] = out, types.bytes(out), 1
                live += size[out]
        scratch, estimated = _scratch(node, types, large, native)
        during = live
        now = tuple(sorted(((b, size[b]) for b, n in names.items() if n or b in pinned), key=lambda kv: -kv[1])[:2])
        pair = now if sum(b for _, b in now) > sum(b for _, b in pair) else pair
        for name in dead:
            buffer = owner.get(name)
            if buffer is not None:
                names[buffer] -= 1
                live -= size[buffer] if not names[buffer] and buffer not in pinned else 0
        steps.append(Step(index, node.name, node.op_type, held + during, scratch, held + live, estimated))
    return steps, pair
