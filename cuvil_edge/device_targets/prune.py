"""AST pruning: specialise generated source for one target's capability constants.

Passes, in order (each an :class:`ast.NodeTransformer` or a small walk):

1. :class:`Substitute` replaces loads of the constants by literals and drops
   their module-level assignments.
2. :class:`Fold` folds ``not``/``-``, ``and``/``or``, comparisons and arithmetic
   over literals, replaces ``if``/``while``/``x if c else y`` with a literal
   test by the live branch (an emptied body gets ``pass``), and drops
   statements after ``return``/``raise``/``break``/``continue``.
3. :func:`remove_unused_functions` drops top-level functions (and classes) that
   are not reachable from the roots (``run`` and top-level statements).
   It runs before the other passes too: they only remove references, so what
   is unreachable then stays unreachable, and is not folded for nothing.

Before any of them, the kernels' ``# fallback: <why>`` comments become marker statements
(:mod:`.fallbacks`), so that a declaration goes wherever its branch goes: a branch folded away
takes its marker along, and a branch that always runs, spliced into its block, loses it.

Top-level statements the passes did not change are copied from the input
text, so comments inside untouched functions survive; changed ones are
re-rendered with :func:`ast.unparse`.  Pruning is idempotent.  Whether a
statement changed is recorded by the passes themselves (:class:`_Tracking`:
every node a visit replaces or drops, and the few in-place edits), not found
by dumping the tree before and after (a quarter of the time pruning took).

One call site's copy of a kernel is made by :mod:`.specialise` on this
module's :class:`Fold`.
"""

from __future__ import annotations

import ast
import io
import operator
from collections.abc import Callable, Mapping
from typing import Any

from cuvil_edge.device_targets.ast_walk import Transformer, walk
from cuvil_edge.device_targets.fallbacks import declare, is_marker
from cuvil_edge.errors import BuildError

_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_,
    ast.BitXor: operator.xor,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_TERMINAL = (ast.Return, ast.Raise, ast.Break, ast.Continue)
_LITERALS = (bool, int, float, complex, str, bytes, type(None))
_MISSING = object()
#: rounds of module-wide folding (fold_calls): a call evaluated, or a parameter bound, may make
#: another one literal (a kernel's literal reaches its helper's helper in two)
_MODULE_ROUNDS = 6


def literal(node: ast.AST) -> Any:
    """The Python value of a literal node (constants and tuples/lists/sets of them), else ``_MISSING``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and isinstance(getattr(node, "ctx", ast.Load()), ast.Load):
        items = [literal(e) for e in node.elts]
        if any(i is _MISSING for i in items):
            return _MISSING
        try:
            return {ast.Tuple: tuple, ast.List: list, ast.Set: frozenset}[type(node)](items)
        except TypeError:  # unhashable set member: leave it to run time
            return _MISSING
    return _MISSING


def _small(value: Any) -> bool:
    """Results we are willing to inline (no huge ints or strings from folding)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() <= 256
    if isinstance(value, (str, bytes)):
        return len(value) <= 200
    return isinstance(value, _LITERALS)


def _const(value: Any, like: ast.AST) -> ast.expr:
    return ast.copy_location(ast.Constant(value), like)


class _Tracking(Transformer):
    """A transformer that sets ``changed`` when a visit returns anything but the node it was given
    (a replacement, a list spliced in, None for a removal); subclasses set it themselves for the
    in-place edits they make. :func:`prune` resets it per top-level statement."""

    changed = False

    def visit(self, node: ast.AST) -> Any:
        result = super().visit(node)
        if result is not node:
            self.changed = True
        return result


class Substitute(_Tracking):
    """Replace loads of the capability constants by literals; drop their top-level assignments.

    Raises:
        BuildError: the source stores to a constant anywhere but a top-level assignment.
    """

    def __init__(self, constants: Mapping[str, object]):
        bad = [k for k, v in constants.items() if not isinstance(v, _LITERALS)]
        if bad:
            raise BuildError(f"capability constants {bad} are not plain literals")
        self.constants = dict(constants)

    def is_constant_assignment(self, stmt: ast.stmt) -> bool:
        """A top-level ``TARGET_X = ...`` (the generated module's reference values), which goes."""
        return isinstance(stmt, ast.Assign) and all(
            isinstance(t, ast.Name) and t.id in self.constants for t in stmt.targets
        )

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = []
        for stmt in node.body:
            if self.is_constant_assignment(stmt):
                self.changed = True
                continue
            body.append(self.visit(stmt))
        node.body = [s for s in body if s is not None]
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        if node.arg in self.constants:
            raise BuildError(f"line {node.lineno}: parameter {node.arg} shadows a capability constant; rename it")
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id not in self.constants:
            return node
        if not isinstance(node.ctx, ast.Load):
            raise BuildError(f"line {node.lineno} assigns to capability constant {node.id}; templates may only read it")
        return _const(self.constants[node.id], node)


class Fold(_Tracking):
    """Fold literal expressions and remove branches whose test is a literal."""

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        value = literal(node.operand)
        if value is _MISSING:
            return node
        return self._try(lambda: _UNARY[type(node.op)](value), node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        left, right = literal(node.left), literal(node.right)
        if left is _MISSING or right is _MISSING or type(node.op) not in _BINARY:
            return node
        if isinstance(node.op, ast.Pow) and isinstance(right, int) and abs(right) > 64:
            return node
        return self._try(lambda: _BINARY[type(node.op)](left, right), node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        values = [literal(node.left)] + [literal(c) for c in node.comparators]
        if any(v is _MISSING for v in values):
            return node

        def chain() -> bool:
            return all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, values, values[1:], strict=False))

        return self._try(chain, node)

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        """Short-circuit over literal operands; keeps the value semantics of ``and``/``or``."""
        self.generic_visit(node)
        stop_on_truth = isinstance(node.op, ast.Or)
        kept: list[ast.expr] = []
        for index, operand in enumerate(node.values):
            value = literal(operand)
            last = index == len(node.values) - 1
            if value is _MISSING or last:
                kept.append(operand)
                if value is not _MISSING:
                    break
                continue
            if bool(value) == stop_on_truth:
                kept.append(operand)  # decides the result: later operands never run
                break
            # a literal that lets evaluation continue contributes nothing
        if len(kept) == 1:
            return kept[0]
        if len(kept) != len(node.values):
            self.changed = True
            node.values = kept
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        test = literal(node.test)
        if test is _MISSING:
            return node
        return node.body if test else node.orelse

    def visit_If(self, node: ast.If) -> Any:
        self.generic_visit(node)
        test = literal(node.test)
        if test is _MISSING:
            if not node.body:
                self.changed = True
                node.body = [ast.Pass()]
            return node
        return _undeclared(node.body if test else node.orelse) or None

    def visit_While(self, node: ast.While) -> Any:
        self.generic_visit(node)
        test = literal(node.test)
        if test is _MISSING or test:
            if not node.body:
                self.changed = True
                node.body = [ast.Pass()]
            return node
        return _undeclared(node.orelse) or None

    def generic_visit(self, node: ast.AST) -> ast.AST:
        """Visit children; drop statements after return/raise/break/continue; an emptied body gets ``pass``."""
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                for index, stmt in enumerate(block):
                    if isinstance(stmt, _TERMINAL):
                        if index + 1 < len(block):
                            self.changed = True
                            del block[index + 1 :]
                        break
        if not isinstance(node, ast.Module) and getattr(node, "body", None) == []:
            self.changed = True
            node.body = [ast.Pass()]  # type: ignore[attr-defined]  # a node with a body: checked above
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        """``(2, 2)[0]``: an item of a literal tuple at a literal index (what substituting a
        tuple attribute leaves)."""
        self.generic_visit(node)
        items, index = literal(node.value), literal(node.slice)
        if (
            not isinstance(node.ctx, ast.Load)
            or not isinstance(items, tuple)
            or not isinstance(index, int)
            or isinstance(index, bool)
        ):
            return node
        return self._try(lambda: items[index], node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        """``{'relu': 0, ...}.get('relu', -1)``: a literal mapping read at a literal key."""
        self.generic_visit(node)
        f = node.func
        if not (
            isinstance(f, ast.Attribute)
            and f.attr == "get"
            and isinstance(f.value, ast.Dict)
            and not node.keywords
            and 1 <= len(node.args) <= 2
            and None not in f.value.keys
        ):
            return node
        parts = [literal(e) for e in (*f.value.keys, *f.value.values, *node.args)]  # type: ignore[arg-type]  # no None key: refused above
        if any(p is _MISSING for p in parts):
            return node
        count = len(f.value.keys)
        return self._try(
            lambda: dict(zip(parts[:count], parts[count : 2 * count], strict=True)).get(*parts[2 * count :]), node
        )

    @staticmethod
    def _try(compute: Callable[[], Any], node: ast.AST) -> ast.AST:
        try:
            value = compute()
        except Exception:  # noqa: BLE001 - left to run time, where it raises as written
            return node
        return _const(value, node) if _small(value) else node


def _undeclared(block: list[ast.stmt]) -> list[ast.stmt]:
    """A branch that always runs, spliced into the block around it: it is no fallback now, and a
    marker left in it would declare the statements after the branch too (:mod:`.fallbacks`)."""
    return [s for s in block if not is_marker(s)]


def _references(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


#: The names a top-level statement reads, by id, with the statement itself (an id is reused once
#: its object is gone): kept by one prune across its rounds for the statements no round changed.
_Known = dict[int, tuple[ast.stmt, set[str]]]


def remove_unused_functions(
    tree: ast.Module, roots: tuple[str, ...] = ("run",), known: _Known | None = None
) -> ast.Module:
    """Drop top-level defs not reachable from ``roots`` or from other top-level statements.
    ``known``: the references of statements unchanged since an earlier call, filled in here."""
    known = {} if known is None else known

    def references(stmt: ast.stmt) -> set[str]:
        entry = known.get(id(stmt))
        if entry is None or entry[0] is not stmt:
            entry = known[id(stmt)] = (stmt, _references(stmt))
        return entry[1]

    defs = {s.name: s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    pending = [r for r in roots if r in defs]
    for stmt in tree.body:
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending.extend(references(stmt) & defs.keys())
    used: set[str] = set()
    while pending:
        name = pending.pop()
        if name in used:
            continue
        used.add(name)
        pending.extend((references(defs[name]) & defs.keys()) - used)
    tree.body = [s for s in tree.body if (n := getattr(s, "name", None)) not in defs or n in used] or [ast.Pass()]
    return tree


def prune(source: str, constants: Mapping[str, object], *, roots: tuple[str, ...] = ("run",)) -> str:
    """Specialise ``source`` for ``constants``: substitute, fold, drop dead code.

    Raises:
        BuildError: ``source`` is not valid Python, stores to a constant, or a
            constant is not a plain literal.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise BuildError(f"generated source does not parse: {e}") from e
    segment = segmenter(source)
    # Folding only ever removes references, so what is unreachable now stays unreachable: drop it
    # before folding (the generic kernels every call site replaced by a specialised copy).
    tree = remove_unused_functions(tree, roots)
    declared = declare(tree, source)  # a verbatim template's fallback comments, as markers
    substitute, fold = Substitute(constants), Fold()
    body: list[ast.stmt] = []
    unchanged: set[int] = set()
    for stmt in tree.body:
        if substitute.is_constant_assignment(stmt):
            continue
        substitute.changed = fold.changed = False
        result = fold.visit(substitute.visit(stmt))
        kept = result if isinstance(result, list) else [] if result is None else [result]
        if not (substitute.changed or fold.changed or id(stmt) in declared):
            unchanged.add(id(stmt))
        body.extend(kept)
    for index, stmt in enumerate(body):  # as Fold does in any block: nothing runs after a raise
        if isinstance(stmt, _TERMINAL):
            del body[index + 1 :]
            break
    tree.body = body
    from cuvil_edge.device_targets.fold_calls import fold_calls  # both built on this module's literals
    from cuvil_edge.device_targets.fold_locals import refine

    facts: dict[int, tuple] = {}  # fold_calls' findings of the functions no round has changed since
    known: _Known = {}  # and the names each statement reads
    for _ in range(_MODULE_ROUNDS):  # what the module's functions make certain, now that constants are in
        # a function nothing reaches any more still calls the others: its calls would keep their
        # arguments from looking constant (fold_calls binds what every call passes alike)
        tree = remove_unused_functions(tree, roots, known)
        touched = fold_calls(tree, roots, facts)
        if not touched:
            break
        unchanged -= touched
        for key in touched:
            known.pop(key, None)
        tree.body = [
            (refine(stmt, {})[0] if isinstance(stmt, ast.FunctionDef) else fold.visit(stmt))
            if id(stmt) in touched
            else stmt
            for stmt in tree.body
        ]
    tree = remove_unused_functions(tree, roots, known)  # unparse needs no locations: no fix_missing_locations
    chunks = []
    for stmt in tree.body:
        text = segment(stmt) if id(stmt) in unchanged and not getattr(stmt, "decorator_list", None) else None
        chunks.append(text if text is not None else ast.unparse(stmt))  # segments start after decorators
    return _header(source) + _join(tree.body, chunks)


def segmenter(source: str) -> Callable[[ast.stmt | ast.expr], str | None]:
    """A function giving the exact source text of a node parsed from ``source`` (as
    :func:`ast.get_source_segment`, which splits the whole source again on every call)."""
    lines = io.StringIO(source, newline="").readlines()  # the line breaks ast counts (not \f, \x1c, ...)

    def segment(node: ast.stmt | ast.expr) -> str | None:
        chunk = [line.encode() for line in lines[node.lineno - 1 : node.end_lineno]]
        if not chunk:
            return None
        chunk[-1] = chunk[-1][: node.end_col_offset]
        chunk[0] = chunk[0][node.col_offset :]
        return b"".join(chunk).decode()

    return segment


def _header(source: str) -> str:
    """The leading comment block of ``source`` (kept verbatim)."""
    lines = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def _join(body: list[ast.stmt], chunks: list[str]) -> str:
    out = []
    for index, (stmt, chunk) in enumerate(zip(body, chunks, strict=True)):
        is_def = isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        prev_def = index > 0 and isinstance(body[index - 1], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if index and (is_def or prev_def):
            out.append("\n\n")
        out.append(chunk + "\n")
    return "".join(out)
