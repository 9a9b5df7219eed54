"""Generate the source of one Python module that runs a graph with numpy.

The generated (unpruned) module is target-independent:

* a header comment and ``import numpy as np``;
* every capability constant as a module-level ``TARGET_X = ...`` with the
  reference value (the pruner substitutes the target's values and drops these);
* the TEMPLATE of every op the graph uses, deduplicated (the pruner removes the
  functions no call reaches);
* per call site of an op-contract kernel, a copy specialised for that node: its static
  attributes (and absent optional inputs) substituted as literals and the branches they decide
  pruned (``specialise.specialise_function``); identical copies are shared, the generic kernel is
  then unused and the pruner drops it;
* ``_forward(W, feeds)``: straight-line code, one call per node (a comment names the node),
  values named ``v0, v1, ...`` and deleted after their last use;
* ``run(W, feeds)``: the wrapper, with ``if COMPUTE_FP16:`` casts and an
  ``if TARGET_STATIC_SHAPES:`` branch that runs fixed-size batch chunks.
"""

from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from cuvil_edge.device_targets import shape_code
from cuvil_edge.device_targets.ast_walk import walk
from cuvil_edge.device_targets.prune import _MISSING, literal, segmenter
from cuvil_edge.device_targets.specialise import specialise_function
from cuvil_edge.errors import BuildError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.ops._contract import OpDef, source_literal, source_of
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES

#: Bump when the generated code's shape changes (part of every cache key).
CODEGEN_VERSION = "4"  # 2: kernels specialised per call site; 3: shape vectors as literals; 4: element types
# folded, declared fallbacks

#: Names the generated wrapper defines; op templates must not reuse them.
RESERVED = frozenset({"np", "run", "_forward", "_run_static_batches", "BUILT_FOR", "W", "feeds"})


@dataclass(frozen=True)
class BatchPlan:
    """How a static-shape target splits a batch: the symbol and the inputs that carry it."""

    symbol: str | None
    batched_inputs: tuple[str, ...]


def batch_plan(graph: Graph) -> BatchPlan:
    """The leading-batch plan for static-shape targets.

    Supported: every symbolic dim of the graph inputs and outputs is the same
    symbol at axis 0, and every output carries it when any input does.

    Raises:
        BuildError: the graph has other symbolic dims, or an output without the batch axis.
    """
    symbols: set[str] = set()
    for v in (*graph.inputs, *graph.outputs):
        for axis, dim in enumerate(v.type.shape):
            if isinstance(dim, str):
                if axis != 0:
                    raise BuildError(
                        f"value {v.name!r} has symbolic dim {dim!r} at axis {axis}; static-shape targets "
                        "support only a leading batch dim. Export the model with fixed non-batch dims."
                    )
                symbols.add(dim)
    if len(symbols) > 1:
        raise BuildError(f"graph {graph.name!r} has several batch symbols {sorted(symbols)}; use one")
    if not symbols:
        return BatchPlan(None, ())
    symbol = symbols.pop()
    unbatched = [v.name for v in graph.outputs if not v.type.shape or v.type.shape[0] != symbol]
    if unbatched:
        raise BuildError(
            f"outputs {unbatched} of graph {graph.name!r} have no leading {symbol!r} axis, so a static-shape "
            "target cannot split the batch into chunks"
        )
    return BatchPlan(symbol, tuple(v.name for v in graph.inputs if v.type.shape and v.type.shape[0] == symbol))


@cache
def _op_template(op_type: str) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """The top-level definitions of one op's template, parsed once per process: (key, names
    defined, source text) each. A key is the first defined name (``op:index`` for a statement
    that defines none). Only the ops a graph uses are parsed: parsing every op's template takes
    about half a second in a fresh process (the whole registry, 2-core dev machine).

    Raises:
        BuildError: the template is not valid Python, or reuses a reserved name.
    """
    template = ops.registry()[op_type].TEMPLATE
    try:
        tree = ast.parse(template)
    except SyntaxError as e:
        raise BuildError(f"TEMPLATE of op {op_type} is not valid Python: {e}") from e
    segment = segmenter(template)
    out = []
    for index, stmt in enumerate(tree.body):
        names = tuple(_defined_names(stmt))
        for name in names:
            if name in RESERVED or name in DEFAULT_CAPABILITIES:
                raise BuildError(f"TEMPLATE of op {op_type} defines reserved name {name!r}; rename it")
        text = segment(stmt) or ast.unparse(stmt)
        out.append((names[0] if names else f"{op_type}:{index}", names, text))
    return tuple(out)


def _same_definition(a: str, b: str) -> bool:
    """Two definitions of one name are the same when their text or, failing that, their AST is."""
    return a == b or ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


def templates_for(op_types) -> list[tuple[str, str]]:
    """(op type, source) of the templates ``op_types`` need, sorted by op type; a definition
    shared by several ops is given once, under the first of them.

    Raises:
        BuildError: a template is invalid, or two of these ops define one name differently.
    """
    texts: dict[str, str] = {}
    owner: dict[str, tuple[str, str]] = {}  # defined name -> (op type, text)
    out = []
    for op_type in sorted(set(op_types)):
        keys = []
        for key, names, text in _op_template(op_type):
            for name in names:
                if name in owner and not _same_definition(owner[name][1], text):
                    raise BuildError(f"ops {owner[name][0]} and {op_type} both define {name!r} differently")
            if key not in texts:
                texts[key] = text
                keys.append(key)
                for name in names:
                    owner.setdefault(name, (op_type, text))
        if keys:
            out.append((op_type, "\n\n\n".join(texts[k] for k in keys)))
    return out


@lru_cache(maxsize=1)
def template_functions() -> tuple[tuple[str, str], ...]:
    """(op type, template source) for every registered op, sorted by op type, deduplicated.

    Raises:
        BuildError: as :func:`templates_for`, over the whole registry.
    """
    return tuple(templates_for(ops.registry()))


@lru_cache(maxsize=1)
def templates_digest() -> str:
    """sha256 over :data:`CODEGEN_VERSION`, the registered op types and the bytes of every source
    file code generation reads: every file of the op package (kernels, helpers, ``attrs``, the
    capability defaults; build outputs such as ``.so`` aside), any other file a kernel, helper or
    ``attrs`` lives in, and this module and the pruner. Changes whenever any kernel changes (and,
    conservatively, when anything else in those files does). Hashing the files (about 10 ms in a fresh
    process) replaces parsing every template (about 0.5 s), which a fresh agent process would
    otherwise pay on every cache hit.

    Raises:
        BuildError: one of those files cannot be read.
    """
    here = os.path.abspath(__file__)  # os.path, not pathlib: a fresh process pays this on its first hit
    root = os.path.dirname(os.path.dirname(here))  # the cuvil_edge package: files are named relative to it
    # every file of the op package (sources, and anything a kernel path reads beside them, such as C)
    names = {
        os.path.join(folder, n)
        for folder in ops.__path__
        for n in os.listdir(folder)
        if not n.startswith(".") and not n.endswith((".pyc", ".so", ".tmp"))
    }
    names |= {here, os.path.join(os.path.dirname(here), "prune.py")}
    registry = ops.registry()
    names |= {
        function.__code__.co_filename
        for op in registry.values()
        for function in (*op.helpers, op.fn, op.attrs)
        if hasattr(function, "__code__")
    }
    files = sorted({os.path.abspath(n) for n in names if os.path.isfile(n)})  # not "<string>" (exec'd code)
    h = hashlib.sha256(f"{CODEGEN_VERSION}\0{','.join(sorted(registry))}".encode())
    for path in files:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise BuildError(f"cannot read {path} to key the build cache: {e}; check the installation") from e
        inside = os.path.commonpath([root, path]) == root
        name = os.path.relpath(path, root).replace(os.sep, "/") if inside else os.path.basename(path)
        h.update(f"\0{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _defined_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)]
    return []


def generate_source(graph: Graph, *, compute_fp16: bool | None = None) -> str:
    """The unpruned module source for ``graph``, independent of the target but for one fact:
    ``compute_fp16``, whether the build computes float32 values in float16 (the target's
    COMPUTE_FP16). Kernel copies are specialised for the element types their inputs hold at run
    time, which are the graph's except float32 in a float16 build; None (not known): float32
    inputs are not specialised for their type.

    Raises:
        BuildError: a template is invalid, or writing the call of a node failed.
        UnsupportedOpError: a node's op has no module.
    """
    parts = [
        f"# cuvil-edge generated module (codegen {CODEGEN_VERSION}) for graph {graph.name!r}",
        f"# {len(graph.nodes)} nodes, inputs {[v.name for v in graph.inputs]}, "
        f"outputs {[v.name for v in graph.outputs]}",
        "# Do not edit: regenerated from the package by cuvil_edge.device_targets.",
        "import numpy as np",
        "",
        "\n".join(f"{key} = {value!r}" for key, value in DEFAULT_CAPABILITIES.items()),
        "BUILT_FOR = {'target': TARGET_NAME, 'arch': TARGET_ARCH, 'simd_bits': TARGET_SIMD_BITS, "
        "'fp16': COMPUTE_FP16, 'static_batch': TARGET_STATIC_BATCH if TARGET_STATIC_SHAPES else None}",
    ]
    for node in graph.nodes:
        ops.get(node.op_type, node.describe())  # an unknown op is refused here, naming the node
    used = {node.op_type for node in graph.nodes}
    for op_type, text in templates_for(used):  # the pruner would drop the others' anyway
        parts.append(f"\n# --- op {op_type}\n{text}")
    specialised = Specialiser(compute_fp16)
    forward = _forward_source(graph, specialised)
    if specialised.functions:
        parts.append("\n# --- kernels specialised per call site")
        parts.extend(specialised.functions)
    parts.append(forward)
    parts.append(_static_source(graph))
    parts.append(_run_source(graph))
    return "\n".join(parts) + "\n"


class Specialiser:
    """Copies of op-contract kernels specialised per call site, shared between identical sites."""

    PLACEHOLDER = "__cuvil_specialised__"

    def __init__(self, compute_fp16: bool | None = None) -> None:
        #: float32 values are float32 at run time (False), float16 (True), or not known (None)
        self.compute_fp16 = compute_fp16
        self.functions: list[str] = []
        self._names: dict[str, str] = {}  # specialised text -> its name
        self._count: dict[str, int] = {}

    def call(
        self, op: OpDef, node: Node, args: list[str], outs: list[str], types: Mapping[str, Any] | None = None
    ) -> str:
        """The call line for ``node``; adds the specialised kernel it calls when it is new.
        ``types``: the graph's value types, whose static dims are folded into the copy."""
        while args and not args[-1]:
            args = args[:-1]
        attrs = dict(op.attrs(node))
        values = dict(attrs)
        function = op.fn
        positional = list(function.__code__.co_varnames[: function.__code__.co_argcount])
        for index, arg in enumerate(args):
            if not arg and index < len(positional):
                values[positional[index]] = None  # absent optional input: `if b is not None` folds
        defaults = dict(
            zip(
                positional[len(positional) - len(function.__defaults__ or ()) :],
                function.__defaults__ or (),
                strict=True,
            )
        )
        for param in positional[len(args) :]:
            if param not in values and param in defaults:
                values[param] = defaults[param]  # a trailing input not given: its default
        present = [positional[i] for i, arg in enumerate(args) if arg and i < len(positional)]
        shapes = {
            positional[i]: tuple(types[name].shape)
            for i, name in enumerate(node.inputs[: len(args)])
            if types is not None and args[i] and i < len(positional) and name in types
        }
        dtypes = {
            param: dtype
            for param, dtype in (
                (positional[i], types[name].dtype)
                for i, name in enumerate(node.inputs[: len(args)])
                if types is not None and args[i] and i < len(positional) and name in types
            )
            if dtype != "float32" or self.compute_fp16 is False
        }
        shown = ", ".join(f"{k}={source_literal(v)}" for k, v in values.items())
        doc = f"{function.__name__} specialised for {shown or 'its inputs'}"
        text, bound, changed = specialise_function(
            source_of(function), self.PLACEHOLDER, values, present, doc[:400], shapes, dtypes
        )
        if not changed:
            return op.emit(node, args, outs)
        text = self._with_helpers(text, {h.__name__: h for h in op.helpers})
        name = self._named(function.__name__, text)
        call_args = [a for index, a in enumerate(args) if index >= len(positional) or positional[index] not in bound]
        call_args = [a if a else "None" for a in call_args]
        call_args += [f"{k}={source_literal(v)}" for k, v in attrs.items() if k not in bound]
        target = outs[0] if len(outs) == 1 else ", ".join(outs)
        return f"{target} = {name}({', '.join(call_args)})"

    #: How deep helper copies go (a helper's copy calling another helper with literals, ...).
    HELPER_DEPTH = 3

    def _with_helpers(self, text: str, helpers: dict[str, Callable[..., Any]], depth: int = 0) -> str:
        """``text`` with every call of a helper whose arguments include literals sent to a copy
        of that helper specialised for them, as kernels are per call site: a generic helper
        pasted whole (``_activate``) keeps every activation's branch and the kernels they call;
        the call site's copy keeps the branch it takes, and the pruner drops what nothing calls."""
        if depth >= self.HELPER_DEPTH or not helpers:
            return text
        tree = ast.parse(text)
        changed = False
        for call in [n for n in walk(tree) if isinstance(n, ast.Call)]:
            func = call.func
            if not isinstance(func, ast.Name):
                continue
            helper = helpers.get(func.id)
            if (
                helper is None
                or any(isinstance(a, ast.Starred) for a in call.args)
                or any(k.arg is None for k in call.keywords)
            ):
                continue
            params = list(helper.__code__.co_varnames[: helper.__code__.co_argcount])
            given = [*zip(params, call.args, strict=False), *((k.arg, k.value) for k in call.keywords)]
            values = {p: v for p, v in ((p, literal(a)) for p, a in given) if v is not _MISSING}
            if not values:
                continue
            shown = ", ".join(f"{k}={source_literal(v)}" for k, v in values.items())
            copy, bound, specialised = specialise_function(
                source_of(helper),
                self.PLACEHOLDER,
                values,  # type: ignore[arg-type]  # no **kwargs keyword: skipped above
                (),
                f"{helper.__name__} specialised for {shown}"[:400],
            )
            if not specialised:
                continue
            copy = self._with_helpers(copy, helpers, depth + 1)
            func.id = self._named(helper.__name__, copy)
            call.args = [a for p, a in zip(params, call.args, strict=False) if p not in bound] + call.args[
                len(params) :
            ]
            call.keywords = [k for k in call.keywords if k.arg not in bound]
            changed = True
        return ast.unparse(tree) if changed else text

    def _named(self, base: str, text: str) -> str:
        """The name of the specialised copy ``text`` of ``base``, added to the module when new."""
        name = self._names.get(text)
        if name is None:
            self._count[base] = self._count.get(base, 0) + 1
            name = f"{base}_{self._count[base]}"
            self._names[text] = name
            self.functions.append("\n\n" + text.replace(self.PLACEHOLDER, name, 1))
        return name


def _forward_source(graph: Graph, specialised: Specialiser) -> str:
    names: dict[str, str] = {}

    def ident(value: str) -> str:
        if value not in names:
            names[value] = f"v{len(names)}"
        return names[value]

    lines = ["", "", "def _forward(W, feeds):", '    """Straight-line graph body: one kernel call per node."""']
    for v in graph.inputs:
        lines.append(f"    {ident(v.name)} = feeds[{v.name!r}]")
    shapes = shape_code.plan(graph)
    reads = lambda index, node: () if index in shapes.literals else node.inputs  # noqa: E731
    running = [(index, node) for index, node in enumerate(graph.nodes) if index in shapes.live]
    needed = {i for index, n in running for i in reads(index, n)} | {v.name for v in graph.outputs}
    for key in graph.initializers:
        if key in needed:
            lines.append(f"    {ident(key)} = W[{key!r}]")
    for symbol, (name, axis) in shapes.symbols.items():
        lines.append(f"    {shape_code.variable(symbol)} = {ident(name)}.shape[{axis}]")
    last_use: dict[str, int] = {}
    for index, node in running:
        for name in reads(index, node):
            if name:
                last_use[name] = index
    keep = {v.name for v in graph.outputs}
    for index, node in running:
        outs = [ident(o) if o else "_" for o in node.outputs]
        if index in shapes.literals:
            lines.append(f"    # {node.op_type} node {node.name!r}: evaluated by the build"[:200])
            lines.extend(f"    {outs[i]} = {shapes.literals[index][o]}" for i, o in enumerate(node.outputs) if o)
            dead = [o for o in node.outputs if o and o not in keep and o not in last_use]
            if dead:
                lines.append(f"    del {', '.join(names[d] for d in dead)}")
            continue
        module = ops.get(node.op_type, node.describe())
        args = [ident(i) if i else "" for i in node.inputs]
        try:
            call = specialised.call(module, node, args, outs, graph.types)
        except Exception as e:  # an op module fault must name the node
            raise BuildError(f"writing the call of {node.describe()} failed: {type(e).__name__}: {e}") from e
        lines.append(f"    # {node.op_type} node {node.name!r}"[:200])
        lines.extend(f"    {line}" for line in call.splitlines())
        dead = [o for o in node.outputs if o and o not in keep and o not in last_use]
        dead += [i for i in dict.fromkeys(node.inputs) if i and last_use.get(i) == index and i not in keep]
        if dead:
            lines.append(f"    del {', '.join(names[d] for d in dict.fromkeys(dead))}")
    result = ", ".join(f"{v.name!r}: {ident(v.name)}" for v in graph.outputs)
    lines.append(f"    return {{{result}}}")
    return "\n".join(lines)


def _static_source(graph: Graph) -> str:
    try:
        plan: BatchPlan | None = batch_plan(graph)
    except BuildError:
        plan = None  # build() refuses static targets for this graph before running it
    head = [
        "",
        "",
        "def _run_static_batches(W, feeds):",
        '    """Static-shape targets: run fixed-size chunks of rows, padding the last one."""',
    ]
    if plan is None:
        return "\n".join(head + ["    raise ValueError('this graph cannot be split into static batch chunks')"])
    if not plan.batched_inputs:
        return "\n".join(head + ["    return _forward(W, feeds)"])
    first = plan.batched_inputs[0]
    body = f"""
    step = TARGET_STATIC_BATCH
    batched = {plan.batched_inputs!r}
    n = feeds[{first!r}].shape[0]
    if n == 0:
        raise ValueError('a static-shape target cannot run an empty batch')
    parts = []
    for start in range(0, n, step):
        chunk = dict(feeds)
        for name in batched:
            rows = feeds[name][start:start + step]
            if rows.shape[0] < step:
                pad = [(0, step - rows.shape[0])] + [(0, 0)] * (rows.ndim - 1)
                rows = np.pad(rows, pad, mode='edge')
            chunk[name] = rows
        parts.append(_forward(W, chunk))
    return {{key: np.concatenate([p[key] for p in parts])[:n] for key in parts[0]}}"""
    return "\n".join(head) + body


def _run_source(graph: Graph) -> str:
    f32_in = tuple(v.name for v in graph.inputs if v.type.dtype == "float32")
    f32_out = tuple(v.name for v in graph.outputs if v.type.dtype == "float32")
    return f'''

def run(W, feeds):
    """Run the graph: W maps initializer names to arrays, feeds maps input names to arrays."""
    if COMPUTE_FP16:
        W = {{k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in W.items()}}
        feeds = dict(feeds)
        for name in {f32_in!r}:
            feeds[name] = feeds[name].astype(np.float16)
    if TARGET_STATIC_SHAPES:
        outputs = _run_static_batches(W, feeds)
    else:
        outputs = _forward(W, feeds)
    if COMPUTE_FP16:
        for name in {f32_out!r}:
            outputs[name] = outputs[name].astype(np.float32)
    return outputs'''
