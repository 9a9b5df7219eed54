"""The op contract: one definition per op, shared by the interpreter and the code generator.

An op is an :class:`OpDef`. Its kernel is an ordinary Python function over numpy arrays (tests
import it, coverage measures it, linters read it); compiled modules run *the same function*: the
code generator pastes its source (:func:`inspect.getsource`) with the helpers it calls. Static
attributes are computed once, by ``attrs(node)``, and reach the kernel as keyword arguments in
both paths: ``kernel(*arrays, **attrs(node))`` in the interpreter, and in the generated module a
call such as ``v7 = k_elu(v6, alpha=0.5)`` (keywords, never opaque positional values).

Families are declared as table rows (``unary.py``, ``binary.py``, ...): a module exposing ``OPS``
(a sequence of OpDef) registers each of them. A kernel may read only ``np``, builtins, the
``TARGET_*``/``COMPUTE_*`` capability constants and the helpers listed with it
(:func:`free_names` checks).

Per-opset behaviour: ``VERSIONS`` lists the opsets at which ONNX changed the op's schema, oldest
first; the oldest is the floor below which a model is refused. ``node.version`` is the model's
default-domain opset as imported (not mapped onto ``VERSIONS``), and ``infer``/``attrs`` branch on
it where behaviour differs (``node.version >= 18``; dtype tables: ``_elementwise.allowed``).
"""

from __future__ import annotations

import builtins
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from cuvil_edge.ir.graph import Node, TensorType

#: Names a kernel may read besides its parameters, locals and listed helpers.
ALLOWED_GLOBALS = frozenset({"np"})


def no_attrs(node: Node) -> dict[str, Any]:
    return {}


def no_scratch(site: Any) -> int:
    """The scratch facet of a kernel that allocates its outputs only (one numpy call, or views)."""
    return 0


def broadcast_scratch(site: Any) -> int:
    """The scratch facet of one ufunc over broadcast operands: numpy buffers a block when an
    operand is neither one element nor the output's size."""
    size = site.outs[0].numel()
    return site.buffer(site.out) * any(t is not None and t.numel() not in (1, size) for t in site.ins)


#: The kinds of ``batch`` facet (privacy/_batch_rules.py maps each onto its rule) -> the
#: parameters a :class:`BatchRule` of that kind may give its rule.
BATCH_KINDS: Mapping[str, tuple[str, ...]] = {
    "same": (),  # each output row from the same row of input 0
    "broadcast": (),  # elementwise over every input, broadcast against each other
    "softmax": (),  # normalises over ``axis`` (the flattening from it below opset 13)
    "reduce": ("since",),  # Reduce*: ``axes`` an attribute before opset ``since``, input 1 from it
    "reshaped": (),  # the batch dim must survive as an axis with the same elements before it
    "transpose": (),
    "concat": (),
    "split": (),
    "slice": (),
    "gather": (),
    "pad": (),
    "created": (),  # Expand / ConstantOfShape: batched where the output's shape has the batch symbol
    "shape": (),  # the batch size, no sample's data
    "windowed": ("sample_axes", "indices"),  # (N, C, spatial...): samples on ``sample_axes`` only
    "batch_norm": (),
    "layer_norm": (),
    "matmul": ("slots", "quant"),  # A, B inputs ``slots``; ``quant``: each one's quantization inputs
    "gemm": (),
    "resize": (),
    "quantize": (),
}
#: The parameterless kinds an op may name by a plain string (``batch="same"``).
BATCH_FACETS = tuple(kind for kind, params in BATCH_KINDS.items() if not params)


@dataclass(frozen=True, init=False)
class BatchRule:
    """The ``batch`` facet with parameters: which rule of :data:`BATCH_KINDS` maps the batch axis
    through the op, which inputs are ``data`` (None: all; they may carry samples), which are
    ``shape`` inputs (they may hold the batch size), whether the op ``creates`` batched values from
    a shape, and the rule's keyword ``params``. Every other input must hold no sample."""

    kind: str
    data: tuple[int, ...] | None
    shape: tuple[int, ...]
    creates: bool
    params: tuple[tuple[str, Any], ...]

    def __init__(
        self,
        kind: str,
        *,
        data: tuple[int, ...] | None = (0,),
        shape: tuple[int, ...] = (),
        creates: bool = False,
        **params: Any,
    ) -> None:
        if kind not in BATCH_KINDS:
            raise ValueError(f"batch rule kind {kind!r} is not one of {tuple(BATCH_KINDS)}")
        unknown = sorted(set(params) - set(BATCH_KINDS[kind]))
        if unknown:
            raise ValueError(f"batch rule {kind!r} takes parameters {BATCH_KINDS[kind]}, not {unknown}")
        for name, value in (("kind", kind), ("data", data), ("shape", shape), ("creates", creates)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "params", tuple(sorted(params.items())))


#: The values the ``trainable`` facet takes: the torch layer agent/torch_model.py trains the op as
#: when its weight is a float32 initializer.
TRAINABLE_KINDS = (
    "conv",  # nn.Conv1d/2d/3d: input, weight (O, I/group, *kernel), optional bias; fused activation
    "gemm",  # nn.Linear: Gemm's transA/transB/alpha/beta and its C input; fused activation
    "matmul",  # nn.Linear: a @ W, optional bias input (else a following Add folds in); fused activation
    "instance_norm",  # nn.GroupNorm(C, C): InstanceNormalization's scale and bias per channel
    "group_norm",  # nn.GroupNorm: num_groups, scale per channel (opset 21) or per group (before)
    "layer_norm",  # nn.LayerNorm over the axes from ``axis`` on; first output only
)

#: The values the ``cost_kind`` facet takes: the kernel family the cost model
#: (device_targets/cost_work.py) costs the op as; an op declaring none is one elementwise numpy pass.
COST_KINDS = (
    "conv",  # k_conv's paths (conv_path): im2col, 1x1, depthwise, native GEMM
    "matmul",  # np.matmul: rows collapsed onto a 2-D weight, else numpy's batched products
    "fused matmul",  # rows collapsed, with a bias and activation epilogue
    "gemm",  # one product of transposable operands, then the bias
    "conv transpose",  # one product per kernel tap
    "int8 conv",  # the C int8 GEMM where the target has it (cost_int8), else elementwise
    "int8 matmul",
    "window taps",  # numpy window loop: a strided view and a ufunc per tap
    "window taps counted",  # and a second tap loop counting each window's cells (AveragePool)
    "normalization",  # statistics by two reductions, then separate passes
    "normalization affine",  # given statistics: four passes, no reduction
    "normalization window",  # a pass per channel tap, then a power (a log and an exp)
    "gather",  # index normalisation, then a take or a broadcast copy
    "reduce",  # numpy's reduction loop per output element
    "transpose",  # a strided copy
    "elementwise",
)
#: The values the ``cost_native`` facet takes: the shape of the op's float32 C kernel's work.
COST_NATIVE_KINDS = ("map", "softmax", "layer norm", "max pool")


@dataclass(frozen=True)
class Probe:
    """One calibration probe of an op's kernel kind (device_targets/calibrate.py times it): a chain
    of the op on a float32 input of ``shape``, with ``attrs`` and constant inputs after the chained
    one (made by ``consts()`` when calibrating, not at import)."""

    shape: tuple[int, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    consts: Callable[[], tuple[Any, ...]] = tuple
    #: the kernel kinds (cost_model's labels) it calibrates; () any. A probe that a spec costs as a
    #: kind it does not list, or as a kind an earlier probe has measured (ops in name order), is
    #: then only one of the interleaved calls of the mixed module
    kinds: tuple[str, ...] = ()


def per_element(cost: int) -> Callable:
    """FLOPs = ``cost`` per output element (of the first output)."""

    def flops(node: Node, inputs: Sequence[TensorType | None], outputs: Sequence[TensorType]) -> int:
        return cost * outputs[0].numel()

    flops.__qualname__ = f"per_element({cost})"
    return flops


@dataclass(frozen=True, eq=False)
class OpDef:
    """One op. The upper-case names (``OP_TYPE``, ``VERSIONS``, ``ATTRS``, ``CONST_INPUTS``, ``TEMPLATE``)
    are the ones the registry (``ops/__init__.py``) and its readers look up."""

    OP_TYPE: str
    VERSIONS: tuple[int, ...]
    infer: Callable[..., list[TensorType]]
    fn: Callable[..., Any]  # the kernel: numpy arrays (and keyword attributes) -> array or tuple of arrays
    flops: Callable[..., int]
    attrs: Callable[[Node], Mapping[str, Any]] = no_attrs
    helpers: tuple[Callable[..., Any], ...] = ()  # functions ``fn`` calls, pasted before it
    ATTRS: Mapping[str, str] = field(default_factory=dict)  # attribute kinds checked by build_graph
    CONST_INPUTS: tuple[int, ...] = ()
    macs: Callable[..., int] | None = None
    # Facets: what the layers above know of the op, declared here so that adding an op is one
    # row (None / False: not declared; the consumer's own table, then its default, decides).
    #: memory plan and cost model: the kernel returns its first input's data as output 0 (a
    #: reshape, ``expand_dims``, the array itself): nothing is allocated or moved, and the input's
    #: buffer lives as long as the view
    view: bool = False
    #: memory plan: transient bytes of one call, given its ``memory_plan.Site`` (:func:`no_scratch`:
    #: the kernel allocates its outputs only)
    scratch: Callable[[Any], int] | None = None
    #: cost model: an exp-class function is evaluated per output element (``transcendental_ns`` each)
    transcendental: bool = False
    #: batch independence (privacy): how the batch axis maps from inputs to outputs, a
    #: :class:`BatchRule`, or a parameterless kind of :data:`BATCH_FACETS` by name: ``"same"``, each
    #: output row is computed from the same row of the one input; ``"broadcast"``, elementwise over
    #: inputs broadcast against each other
    batch: BatchRule | str | None = None
    #: training: the op in torch, ``fn(torch, node, *tensors) -> tensor`` (torch is passed in, so
    #: that the op file imports nothing of it: the base install has no torch)
    torch: Callable[..., Any] | None = None
    #: training: ``check(node)`` refuses, when the torch module is built, a node its ``torch``
    #: lowering could otherwise only refuse mid-training (an attribute value without a torch form)
    torch_check: Callable[[Node], None] | None = None
    #: training: the torch layer the op trains as, one of :data:`TRAINABLE_KINDS` (where its
    #: weight is not a float32 initializer, its ``torch`` lowering runs with the weight constant)
    trainable: str | None = None
    #: cost model: the kernel family it is costed as, one of :data:`COST_KINDS`
    cost_kind: str | None = None
    #: cost model: the op has a float32 C kernel (used where the target builds them), one of
    #: :data:`COST_NATIVE_KINDS`: "map" per element and row, "softmax" with its row remainder,
    #: "layer norm" per element and row, "max pool" the depthwise kernel's padded planes
    cost_native: str | None = None
    #: calibration: probes of its kernel kinds, each timed by ``cuvil-edge calibrate``
    probes: tuple[Probe, ...] = ()

    def __post_init__(self) -> None:
        if self.batch is not None and not isinstance(self.batch, BatchRule) and self.batch not in BATCH_FACETS:
            raise ValueError(
                f"op {self.OP_TYPE}: batch facet {self.batch!r} is neither a BatchRule nor one of {BATCH_FACETS}"
            )
        if self.trainable is not None and self.trainable not in TRAINABLE_KINDS:
            raise ValueError(f"op {self.OP_TYPE}: trainable facet {self.trainable!r} is not one of {TRAINABLE_KINDS}")
        if self.cost_kind is not None and self.cost_kind not in COST_KINDS:
            raise ValueError(f"op {self.OP_TYPE}: cost_kind facet {self.cost_kind!r} is not one of {COST_KINDS}")
        if self.cost_native is not None and self.cost_native not in COST_NATIVE_KINDS:
            raise ValueError(
                f"op {self.OP_TYPE}: cost_native facet {self.cost_native!r} is not one of {COST_NATIVE_KINDS}"
            )

    @property
    def __name__(self) -> str:  # error messages name ops by module name
        return f"{type(self).__module__}.{self.OP_TYPE}"

    def kernel(self, node: Node, *arrays: Any) -> list[Any]:
        """The interpreter's call: the kernel on ``arrays`` with the node's static attributes."""
        out = self.fn(*arrays, **self.attrs(node))
        return list(out) if isinstance(out, tuple) else [out]

    @property
    def TEMPLATE(self) -> str:  # noqa: N802 - the contract's name
        """The source compiled modules run: the helpers', then the kernel's."""
        return "\n\n".join(source_of(f) for f in (*self.helpers, self.fn)) + "\n"

    def emit(self, node: Node, args: Sequence[str], outs: Sequence[str]) -> str:
        """``outs = kernel(args, key=value, ...)``; absent optional inputs are passed as None."""
        while args and not args[-1]:
            args = args[:-1]
        call_args = [a if a else "None" for a in args]
        call_args += [f"{key}={source_literal(value)}" for key, value in self.attrs(node).items()]
        target = outs[0] if len(outs) == 1 else ", ".join(outs)
        return f"{target} = {self.fn.__name__}({', '.join(call_args)})"


def source_literal(value: Any) -> str:
    """Python source for an attribute value: ``repr``, except that non-finite floats (whose repr,
    ``nan``/``inf``, is not an expression) are written as expressions that evaluate to them."""
    import ast
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return ast.unparse(ast.Constant(value))
    if isinstance(value, tuple):
        inner = ", ".join(source_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


@cache
def source_of(function: Callable[..., Any]) -> str:
    """A function's source, dedented, decorators kept (there are none in kernels). Cached: a
    build asks for each kernel's source once per call site."""
    return textwrap.dedent(inspect.getsource(function)).strip("\n")


def free_names(function: Callable[..., Any]) -> set[str]:
    """Global names ``function`` reads that are neither builtins, allowed (see module doc), nor
    its own parameters and locals."""
    import ast

    tree = ast.parse(source_of(function))
    bound = {
        a.arg
        for n in ast.walk(tree)
        if isinstance(n, ast.arguments)
        for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg)
        if a is not None
    }
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    bound |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda)) and hasattr(n, "name")}
    # a local import (the native-library helper's) binds a local name, not a module global
    bound |= {
        (a.asname or a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return {
        n
        for n in loaded - bound
        if not hasattr(builtins, n) and n not in ALLOWED_GLOBALS and not n.startswith(("TARGET_", "COMPUTE_"))
    }
