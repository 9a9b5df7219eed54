"""Build-time facts inside one specialised kernel copy: the static dims of its array parameters,
and the locals assigned once from literals (``st = (1, 1)``, ``k = len(kernel)``), folded into the
code that reads them, so that the branches they decide are pruned like a literal attribute's.

An array parameter's shape comes from the graph's types, which the build is keyed on (its
structure digest holds every value's type) and which the module checks its inputs against, so a
dim that is an int in the graph is that int at run time; symbolic dims (the batch) stay reads.
A local is folded only when the whole function stores it once, at the top level of its body, from
a literal: every read comes after that statement, and nothing can change it.
"""

from __future__ import annotations

import ast
import builtins
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from cuvil_edge.device_targets.prune import _MISSING, Fold, _is_literal, _literal_node, _small, literal

#: builtins folded when every argument is a literal (and the function does not rebind the name)
_PURE = {"len": len, "max": max, "min": min, "sum": sum, "abs": abs, "tuple": tuple, "any": any, "all": all}
_ROUNDS = 6


def refine(function: ast.FunctionDef, shapes: Mapping[str, tuple]) -> tuple[ast.FunctionDef, bool]:
    """``function`` with the static dims of ``shapes``' parameters and its literal locals folded
    in; and whether anything changed."""
    stored = _stored(function)
    changed = False
    if shapes:
        binder = _Shapes({p: s for p, s in shapes.items() if stored[p] <= 1})  # a parameter counts once
        function = binder.visit(function)
        changed = binder.changed
    for _ in range(_ROUNDS):
        function = Fold().visit(function)
        stored = _stored(function)
        folded = _Builtins(stored)
        function = folded.visit(function)
        function, propagated = _propagate(function, stored)
        if not (propagated or folded.changed):
            break
        changed = True
    return function, changed


def _stored(function: ast.FunctionDef) -> Counter:
    """How many times each name is bound anywhere in ``function`` (parameters, targets, imports)."""
    stored: Counter = Counter()
    for n in ast.walk(function):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            stored[n.id] += 1
        elif isinstance(n, ast.arg):
            stored[n.arg] += 1
        elif isinstance(n, ast.alias):
            stored[(n.asname or n.name).split(".")[0]] += 1
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n is not function:
            stored[n.name] += 1
    return stored


class _Shapes(ast.NodeTransformer):
    """``x.shape``, ``x.shape[i]``, ``x.shape[a:b]``, ``len(x.shape)``, ``x.ndim`` and ``x.size`` of an array
    parameter with known dims: literals where the dims they read are ints."""

    def __init__(self, shapes: Mapping[str, tuple]):
        self.shapes, self.changed = shapes, False

    def _of(self, node: ast.AST) -> tuple | None:
        if isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name):
            return self.shapes.get(node.value.id)
        return None

    def _lit(self, value: Any, like: ast.AST) -> ast.AST:
        if not _is_literal(value):
            return like
        self.changed = True
        return ast.copy_location(_literal_node(value), like)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name) and node.value.id in self.shapes:
            shape = self.shapes[node.value.id]
            if node.attr == "ndim":
                return self._lit(len(shape), node)
            if node.attr == "shape" and all(isinstance(d, int) for d in shape):
                return self._lit(tuple(shape), node)
            if node.attr == "size" and all(isinstance(d, int) for d in shape):
                return self._lit(math.prod(shape), node)
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        shape = self._of(node.value)
        if shape is None or not isinstance(node.ctx, ast.Load):
            return self.generic_visit(node)
        index = literal(node.slice)
        if isinstance(index, int) and not isinstance(index, bool) and -len(shape) <= index < len(shape):
            return self._lit(shape[index], node) if isinstance(shape[index], int) else node
        if isinstance(node.slice, ast.Slice) and node.slice.step is None:
            lo = 0 if node.slice.lower is None else literal(node.slice.lower)
            hi = len(shape) if node.slice.upper is None else literal(node.slice.upper)
            if isinstance(lo, int) and isinstance(hi, int):
                part = shape[lo:hi]
                return self._lit(tuple(part), node) if all(isinstance(d, int) for d in part) else node
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "len"
            and len(node.args) == 1
            and not node.keywords
            and self._of(node.args[0]) is not None
        ):
            return self._lit(len(self._of(node.args[0])), node)  # type: ignore[arg-type]  # checked above
        return self.generic_visit(node)


class _Builtins(ast.NodeTransformer):
    """``len((3, 3))``, ``max((3, 3), default=1)``: pure builtins of literals, where the function
    does not rebind their names."""

    def __init__(self, stored: Counter):
        self.stored, self.changed = stored, False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if not (isinstance(f, ast.Name) and f.id in _PURE and not self.stored[f.id]) or not hasattr(builtins, f.id):
            return node
        args = [literal(a) for a in node.args]
        kwargs = {k.arg: literal(k.value) for k in node.keywords}
        if any(a is _MISSING for a in args) or None in kwargs or any(v is _MISSING for v in kwargs.values()):
            return node
        try:
            value = _PURE[f.id](*args, **kwargs)  # type: ignore[arg-type,operator]  # literals only
        except Exception:  # noqa: BLE001 - left to run time, where it raises as written
            return node
        if not (_is_literal(value) and _small(value)) or isinstance(value, (list, set)):
            return node
        self.changed = True
        return ast.copy_location(_literal_node(value), node)


class _Reads(ast.NodeTransformer):
    def __init__(self, values: Mapping[str, Any]):
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return ast.copy_location(_literal_node(self.values[node.id]), node)
        return node


def _propagate(function: ast.FunctionDef, stored: Counter) -> tuple[ast.FunctionDef, bool]:
    """Top-level ``name = literal`` statements of names stored once: dropped, their reads folded.
    A tuple assignment of a tuple (``a, b = (1, x)``) is split first when no target is read on
    its right."""
    values: dict[str, Any] = {}
    body: list[ast.stmt] = []
    for stmt in function.body:
        if values:
            stmt = _Reads(values).visit(stmt)
        for part in _split(stmt):
            if isinstance(part, ast.Assign) and len(part.targets) == 1 and isinstance(part.targets[0], ast.Name):
                name, value = part.targets[0].id, literal(part.value)
                if stored[name] == 1 and value is not _MISSING and _is_literal(value):
                    values[name] = value
                    continue
            body.append(part)
    function.body = body or [ast.Pass()]
    return function, bool(values)


def _split(stmt: ast.stmt) -> list[ast.stmt]:
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Tuple)
        and isinstance(stmt.value, ast.Tuple)
        and len(stmt.targets[0].elts) == len(stmt.value.elts)
        and all(isinstance(t, ast.Name) for t in stmt.targets[0].elts)
    ):
        return [stmt]
    names = {t.id for t in stmt.targets[0].elts}  # type: ignore[attr-defined]  # Names: checked above
    if any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(stmt.value)):
        return [stmt]  # a, b = b, a: simultaneous, not sequential
    return [
        ast.copy_location(ast.Assign([ast.Name(t.id, ast.Store())], v), stmt)  # type: ignore[attr-defined]
        for t, v in zip(stmt.targets[0].elts, stmt.value.elts, strict=True)
    ]
