"""Build-time facts inside one specialised kernel copy: the static dims of its array parameters,
and the locals assigned once from literals (``st = (1, 1)``, ``k = len(kernel)``), folded into the
code that reads them, so that the branches they decide are pruned like a literal attribute's.

An array parameter's shape comes from the graph's types, which the build is keyed on (its
structure digest holds every value's type) and which the module checks its inputs against, so a
dim that is an int in the graph is that int at run time; symbolic dims (the batch) stay reads.
A local is folded only when the whole function stores it once, at the top level of its body, from
a literal: every read comes after that statement, and nothing can change it.

A top-level loop over a literal tuple (or a ``range`` of literals) whose body only rebinds names
from arithmetic of literals and of names holding literals (``p = 1`` then ``for size in (8, 8):
p *= size``) is run at build time (:func:`_loops`): the loop becomes the assignments it ends
with (``p = 64``), and the literal it started from goes when nothing read it in between, so the
name is stored once and folds like any other literal local. The body's arithmetic is the same
Python arithmetic on the same literals at run time, so the values are the ones the loop makes.
"""

from __future__ import annotations

import ast
import builtins
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from cuvil_edge.device_targets.ast_walk import Transformer, walk
from cuvil_edge.device_targets.prune import _MISSING, Fold, _small, literal
from cuvil_edge.device_targets.specialise import _is_literal, _literal_node

#: builtins folded when every argument is a literal (and the function does not rebind the name)
_PURE = {"len": len, "max": max, "min": min, "sum": sum, "abs": abs, "tuple": tuple, "any": any, "all": all}
_ROUNDS = 6
#: the most iterations of a literal loop :func:`_loops` runs at build time
_ITERATIONS = 256


def refine(
    function: ast.FunctionDef, shapes: Mapping[str, tuple], dtypes: Mapping[str, str] | None = None
) -> tuple[ast.FunctionDef, bool]:
    """``function`` with the static dims of ``shapes``' parameters, the element types of
    ``dtypes``' (numpy dtype names) and its literal locals folded in; and whether anything
    changed."""
    stored = _stored(function)
    changed = False
    if shapes:
        binder = _Shapes({p: s for p, s in shapes.items() if stored[p] <= 1})  # a parameter counts once
        function = binder.visit(function)
        changed = binder.changed
    known = {p: np.dtype(d) for p, d in (dtypes or {}).items() if stored[p] <= 1}
    for _ in range(_ROUNDS):
        function = Fold().visit(function)
        stored = _stored(function)
        typed = _Dtypes(function, known, stored)
        if known:  # with no array of known dtype there is nothing to fold
            function = typed.visit(function)
        folded = _Builtins(stored)
        function = folded.visit(function)
        function, looped = _loops(function)
        if looped:
            stored = _stored(function)
        function, propagated = _propagate(function, stored)
        if not (propagated or folded.changed or looped or typed.changed):
            break
        changed = True
    return function, changed


def _stored(function: ast.FunctionDef) -> Counter:
    """How many times each name is bound anywhere in ``function`` (parameters, targets, imports)."""
    stored: Counter = Counter()
    for n in walk(function):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            stored[n.id] += 1
        elif isinstance(n, ast.arg):
            stored[n.arg] += 1
        elif isinstance(n, ast.alias):
            stored[(n.asname or n.name).split(".")[0]] += 1
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n is not function:
            stored[n.name] += 1
    return stored


class _Shapes(Transformer):
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


class _Dtypes(Transformer):
    """Element types the graph makes known: ``x.dtype == np.float16`` (either way round, ``==`` or
    ``!=``), ``x.dtype.kind``, ``x.dtype.itemsize`` and ``x.itemsize``, for an array parameter of
    known dtype and for a local stored once, at the top of the body, from ``y.astype(t, ...)``
    with ``t`` a known dtype; and ``t == np.float32`` for a local ``t`` stored once from a known
    dtype (``t = x.dtype``). numpy compares the same dtypes the same way at build time as at run
    time, so each fold gives the value the expression has. A local stored from a bare scalar type
    (``t = np.float32``) is not an alias: ``t == np.int64`` then compares classes, which may differ
    where their dtypes are equal (``np.longlong`` and ``np.int64``)."""

    _ATTRIBUTES = ("kind", "itemsize", "name")  # not ``char``: 'l' and 'q' are both int64

    def __init__(self, function: ast.FunctionDef, arrays: Mapping[str, np.dtype], stored: Counter):
        self.stored, self.changed = stored, False
        self.arrays = dict(arrays)  # name -> dtype of an array it holds
        self.aliases: dict[str, np.dtype] = {}  # name -> the dtype it holds (or a numpy scalar type)
        if stored["np"] or not arrays:  # np rebound, or nothing known to start from
            self.arrays = {}
            return
        for stmt in function.body:  # top level: each read of a name stored once comes after it
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                continue
            name, value = stmt.targets[0].id, stmt.value
            if stored[name] != 1:
                continue
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "astype"
                and value.args
                and (dtype := self._dtype(value.args[0])) is not None
            ):
                self.arrays[name] = dtype
            elif not _bare(value) and (dtype := self._dtype(value)) is not None:
                self.aliases[name] = dtype  # a dtype object: compared with a scalar type as numpy does

    def _dtype(self, node: ast.AST) -> np.dtype | None:
        """The dtype ``node`` stands for: ``np.float32``, ``x.dtype`` of a known array, a known alias."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "np" and isinstance(getattr(np, node.attr, None), type):
                scalar = getattr(np, node.attr)
                return np.dtype(scalar) if issubclass(scalar, np.generic) else None
            if node.attr == "dtype":
                return self.arrays.get(node.value.id)
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        return None

    def _lit(self, value: Any, like: ast.AST) -> ast.AST:
        self.changed = True
        return ast.copy_location(ast.Constant(value), like)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        left, right = node.left, node.comparators[0]
        a, b = self._dtype(left), self._dtype(right)
        if a is None or b is None or (_bare(left) and _bare(right)):  # two classes: compared as classes
            return node
        return self._lit((a == b) == isinstance(node.ops[0], ast.Eq), node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load) or node.attr not in self._ATTRIBUTES:
            return node
        inner = node.value
        if isinstance(inner, ast.Attribute) and inner.attr == "dtype" and isinstance(inner.value, ast.Name):
            dtype = self.arrays.get(inner.value.id)  # an array's dtype: a dtype object, with these attributes
        elif node.attr == "itemsize" and isinstance(inner, ast.Name):
            dtype = self.arrays.get(inner.id)  # ndarray.itemsize
        else:
            return node
        return node if dtype is None else self._lit(getattr(dtype, node.attr), node)


def _bare(node: ast.AST) -> bool:
    """``np.<name>``: a numpy scalar type (a class), not a dtype object."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "np"


class _Builtins(Transformer):
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


class _Reads(Transformer):
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
    if any(isinstance(n, ast.Name) and n.id in names for n in walk(stmt.value)):
        return [stmt]  # a, b = b, a: simultaneous, not sequential
    return [
        ast.copy_location(ast.Assign([ast.Name(t.id, ast.Store())], v), stmt)  # type: ignore[attr-defined]
        for t, v in zip(stmt.targets[0].elts, stmt.value.elts, strict=True)
    ]


def _loaded(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in walk(node))


def _binds(node: ast.AST) -> set[str]:
    """The names a statement may bind (targets, loop variables, imports, definitions)."""
    names = {n.id for n in walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    names.update((a.asname or a.name).split(".")[0] for a in walk(node) if isinstance(a, ast.alias))
    names.update(n.name for n in walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    return names


def _iterated(node: ast.expr) -> list[Any] | None:
    """The items of a literal tuple or list, or of ``range`` over int literals; else None."""
    value = literal(node)
    if isinstance(value, (tuple, list)):
        return list(value)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "range"
        and not node.keywords
        and 1 <= len(node.args) <= 3
    ):
        bounds = [literal(a) for a in node.args]
        if all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
            try:
                items = range(*bounds)
            except ValueError:  # range(0, 4, 0): left to raise at run time
                return None
            return list(items) if len(items) <= _ITERATIONS else None
    return None


def _run_loop(loop: ast.For, known: Mapping[str, Any], stored: Counter) -> dict[str, Any] | None:
    """What ``loop`` leaves in the names its body binds, run on ``known``; None when it is not a
    loop of literal arithmetic (see :func:`_loops`)."""
    if (
        loop.orelse
        or not isinstance(loop.target, ast.Name)
        or stored["range"]
        or not all(
            (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name))
            or (isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name))
            for s in loop.body
        )
    ):
        return None
    items = _iterated(loop.iter)
    variable = loop.target.id
    if items is None or len(items) > _ITERATIONS or variable in _binds(ast.Module(loop.body, [])):
        return None
    env = dict(known)
    for item in items:
        env[variable] = item
        for stmt in loop.body:
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                name = stmt.target.id
                expr: ast.expr = ast.BinOp(ast.Name(name, ast.Load()), stmt.op, stmt.value)
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                name, expr = stmt.targets[0].id, stmt.value
            else:  # refused above
                return None
            folded = Fold().visit(_Reads(env).visit(_copy(expr)))
            folded = _Builtins(stored).visit(folded)
            value = literal(folded)
            if value is _MISSING or not _is_literal(value) or not _small(value):
                return None
            env[name] = value
    return {name: env[name] for name in env if name not in known or env[name] is not known[name]}


def _copy(node: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(node), mode="eval").body


def _loops(function: ast.FunctionDef) -> tuple[ast.FunctionDef, bool]:
    """Top-level ``for`` loops of literal arithmetic, run at build time (see the module's
    docstring). The names known are those a top-level ``name = literal`` bound with no statement
    since binding them again; a function with nested scopes or ``global``/``nonlocal`` is left as
    it is (something else could rebind its names)."""
    if not any(isinstance(s, ast.For) and _iterated(s.iter) is not None for s in function.body):
        return function, False  # no literal loop at the top level: nothing to run
    if any(
        n is not function
        and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
        or isinstance(n, (ast.Global, ast.Nonlocal))
        for n in walk(function)
    ):
        return function, False
    stored = _stored(function)
    known: dict[str, Any] = {}
    origin: dict[str, int] = {}  # name -> index in body of the literal assignment that bound it
    body: list[ast.stmt | None] = []
    changed = False
    for stmt in function.body:
        result = _run_loop(stmt, known, stored) if isinstance(stmt, ast.For) else None
        if result is None:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                value = literal(stmt.value)
                if value is not _MISSING and _is_literal(value):
                    known[stmt.targets[0].id], origin[stmt.targets[0].id] = value, len(body)
                    body.append(stmt)
                    continue
            for name in _binds(stmt):
                known.pop(name, None)
                origin.pop(name, None)
            body.append(stmt)
            continue
        changed = True
        variable = stmt.target.id  # type: ignore[attr-defined]  # a Name: _run_loop checked it
        outside = any(_loaded(s, variable) for s in function.body if s is not stmt)
        for name, value in result.items():
            if name == variable and not outside:
                continue  # nothing outside the loop reads its variable
            start = origin.get(name)
            if start is not None and not any(s is not None and _loaded(s, name) for s in body[start + 1 :]):
                body[start] = None  # the literal it started from: read by the loop only, now folded in
            known[name], origin[name] = value, len(body)
            body.append(ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], _literal_node(value)), stmt))
    function.body = [s for s in body if s is not None] or [ast.Pass()]
    return function, changed
