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


#: The values the ``batch`` facet takes (privacy/_batch_rules.py maps each onto its rule).
BATCH_FACETS = ("same", "broadcast")


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
    #: memory plan: transient bytes of one call, given its ``memory_plan.Site`` (:func:`no_scratch`:
    #: the kernel allocates its outputs only)
    scratch: Callable[[Any], int] | None = None
    #: cost model: an exp-class function is evaluated per output element (``transcendental_ns`` each)
    transcendental: bool = False
    #: batch independence (privacy): ``"same"``, each output row is computed from the same row of
    #: the one input; ``"broadcast"``, elementwise over inputs broadcast against each other
    batch: str | None = None
    #: training: the op in torch, ``fn(torch, node, *tensors) -> tensor`` (torch is passed in, so
    #: that the op file imports nothing of it: the base install has no torch)
    torch: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.batch is not None and self.batch not in BATCH_FACETS:
            raise ValueError(f"op {self.OP_TYPE}: batch facet {self.batch!r} is not one of {BATCH_FACETS}")

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
