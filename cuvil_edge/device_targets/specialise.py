"""One call site's copy of a kernel: its literal arguments substituted and the branches they
decide pruned (:func:`specialise_function`), memoised per process (a kernel, the literal values
substituted and the docstring fully determine its result): the call sites of one model repeat a
handful of attribute sets, and a daemon builds the same kernels round after round.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterable, Mapping

from cuvil_edge.device_targets.ast_walk import Transformer, walk
from cuvil_edge.device_targets.fallbacks import declare, is_marker
from cuvil_edge.device_targets.prune import _LITERALS, Fold, _const, literal
from cuvil_edge.errors import BuildError


def specialise_function(
    source: str,
    name: str,
    values: Mapping[str, object],
    present: Iterable[str] = (),
    doc: str | None = None,
    shapes: Mapping[str, tuple] | None = None,
    dtypes: Mapping[str, str] | None = None,
) -> tuple[str, tuple[str, ...], bool]:
    """One call site's copy of a kernel: the parameters in ``values`` become literals, the
    parameters in ``present`` are known to hold arrays (``p is None`` is False), and the branches
    these decide are pruned (:class:`Fold`). ``shapes``: the graph's dims of array parameters (ints
    or symbols), their element types in ``dtypes`` (numpy dtype names), and the locals assigned
    once from literals, are folded in too (:mod:`.fold_locals`). ``dtypes`` must be the types the
    kernel runs on: the graph's only where the module computes in them (an fp16 build casts its
    inputs to float16 at run time, so the graph's float32 would fold the wrong branches).

    ``source`` holds a single ``def``; the copy is renamed ``name`` and, with ``doc``, gets that
    docstring. A parameter is substituted only when its value is a plain literal (or a tuple of
    them) and the body never rebinds it; the others stay parameters. Returns the copy's source,
    the names of the parameters substituted (the call site drops those arguments), and whether
    anything was specialised at all.

    Memoised per process: the result is a function of ``source``, ``name``, ``doc``, the literal
    entries of ``values`` (by type and exact repr, so ``1``, ``1.0`` and ``True`` differ) and the
    set ``present``; the other entries of ``values`` are never substituted.

    Raises:
        BuildError: ``source`` is not one function definition.
    """
    key = (
        source,
        name,
        doc,
        frozenset(present),
        tuple(sorted((k, _tag(v)) for k, v in values.items() if _is_literal(v))),
        tuple(sorted((k, _tag(tuple(v))) for k, v in (shapes or {}).items())),
        tuple(sorted((k, str(v)) for k, v in (dtypes or {}).items())),
    )
    with _MEMO_LOCK:
        done = _SPECIALISED.get(key)
    if done is None:
        done = _specialise(source, name, values, key[3], doc, shapes or {}, dtypes or {})
        with _MEMO_LOCK:
            if len(_SPECIALISED) >= _MEMO_SIZE:  # a long-lived daemon meets a bounded set of models
                _SPECIALISED.clear()
            _SPECIALISED[key] = done
    return done


#: specialise_function's memo: key (see there) -> result (immutable, so shared safely).
_SPECIALISED: dict[tuple, tuple[str, tuple[str, ...], bool]] = {}
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 4096


def _tag(value: object) -> object:
    """A hashable key that tells apart values Python calls equal (``1 == 1.0 == True``, ``0.0 == -0.0``)."""
    if isinstance(value, tuple):
        return tuple(_tag(v) for v in value)
    return type(value).__name__, repr(value)


def _specialise(
    source: str,
    name: str,
    values: Mapping[str, object],
    present: Iterable[str],
    doc: str | None,
    shapes: Mapping[str, tuple],
    dtypes: Mapping[str, str],
) -> tuple[str, tuple[str, ...], bool]:
    from cuvil_edge.device_targets.fold_locals import refine  # it builds on this module's Fold

    tree = ast.parse(source)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise BuildError(f"cannot specialise {name!r}: its source is not one function definition")
    declare(tree, source)  # unparse drops comments: the fallbacks they declare become markers
    function = tree.body[0]
    fixed: set[str] = set()  # names the body rebinds, and parameters of nested functions and lambdas
    for n in walk(function):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            fixed.add(n.id)
        elif n is not function and isinstance(n, (ast.FunctionDef, ast.Lambda)):
            fixed.update(a.arg for a in walk(n.args) if isinstance(a, ast.arg))
    args = function.args
    if args.vararg is not None or args.kwarg is not None:
        return source, (), False
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    chosen = {k: v for k, v in values.items() if k in params and k not in fixed and _is_literal(v)}
    arrays = {p for p in present if p in params and p not in fixed and p not in chosen}
    binder = _Bind(chosen, arrays)
    function = binder.visit(function)
    known = {p: tuple(s) for p, s in shapes.items() if p in arrays}
    function, refined = refine(function, known, {p: str(d) for p, d in dtypes.items() if p in arrays})
    if not chosen and not binder.changed and not refined:
        return source, (), False
    # drop the substituted parameters, keeping each remaining one's default
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(
        zip([a.arg for a in positional][len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    kept = [a for a in positional if a.arg not in chosen]
    args.posonlyargs, args.args = [], kept
    args.defaults = []
    if any(a.arg in defaults for a in kept):
        first = next(i for i, a in enumerate(kept) if a.arg in defaults)
        args.defaults = [defaults.get(a.arg, ast.Constant(None)) for a in kept[first:]]
    kw = [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if a.arg not in chosen]
    args.kwonlyargs, args.kw_defaults = [a for a, _ in kw], [d for _, d in kw]
    function.name = name
    if doc is not None:
        body = function.body
        has_doc = (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
            and not is_marker(body[0])
        )
        function.body = [ast.Expr(ast.Constant(doc))] + (body[1:] if has_doc else body)
    function = Fold().visit(function)
    return ast.unparse(function), tuple(chosen), True  # unparse reads no locations


def _is_literal(value: object) -> bool:
    if isinstance(value, tuple):
        return all(_is_literal(v) for v in value)
    return isinstance(value, _LITERALS)


class _Bind(Transformer):
    """Loads of the given parameters become literals; ``p is None`` / ``p is not None`` of a
    parameter known to hold an array become False / True."""

    def __init__(self, values: Mapping[str, object], arrays: set[str] | frozenset[str] = frozenset()):
        self.values, self.arrays, self.changed = values, arrays, False

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            self.changed = True
            return ast.copy_location(_literal_node(self.values[node.id]), node)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if (
            len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Is, ast.IsNot))
            and isinstance(node.left, ast.Name)
            and node.left.id in self.arrays
            and literal(node.comparators[0]) is None
        ):
            self.changed = True
            return _const(isinstance(node.ops[0], ast.IsNot), node)
        return node


def _literal_node(value: object) -> ast.expr:
    if isinstance(value, tuple):
        return ast.Tuple([_literal_node(v) for v in value], ast.Load())
    return ast.Constant(value)  # type: ignore[arg-type]  # callers pass literals only (_is_literal)
