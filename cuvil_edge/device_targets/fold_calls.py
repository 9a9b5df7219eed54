"""Build-time facts across a module's functions, once the target's constants are literals.

Kernel copies are specialised per call site before the target pruner substitutes the capability
constants, so an argument such as ``TARGET_LARGE_SCRATCH`` is a literal only afterwards, and a
helper that took no argument but literals at specialisation (``_win_out_1()``) is still a call.
:func:`fold_calls` decides what the whole module makes certain, for :func:`prune.prune` to drop:

- a call of a module function with literal arguments, whose body reads only its parameters, its
  locals and pure builtins, is evaluated (``_win_out_1()`` becomes ``(8, 8)``), within a budget
  of executed lines (the values come from a model's attributes: a huge range stays a call);
- a local assigned once, at the top of a function's body, from a call of a module function whose
  every return is a string literal (``path = conv_path_1(native, ...)``) holds one of those
  strings, so comparing it with any other string is decided and the branch it guards goes;
- a branch test is read for its truth, not its value: ``native and False`` is false and
  ``native and True`` is ``native`` (names and comparisons have no effects to keep);
- a parameter of a module function to which every call passes the same literal (a helper called
  from one site: ``conv_path_1(native, True, 2304)``) becomes that literal in its body, and the
  calls drop it (:func:`_bind_constant_arguments`), as kernels are specialised per call site;
  the function must be referenced by calls alone (not passed as a value, not a root the caller
  of the module calls), so that its every call is seen.
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections import Counter
from typing import Any

from cuvil_edge.device_targets.ast_walk import Transformer, walk
from cuvil_edge.device_targets.prune import _MISSING, literal
from cuvil_edge.device_targets.specialise import _Bind, _is_literal, _literal_node, _tag

#: builtins a build-time evaluation may call: pure functions of their arguments
_SAFE = ("range", "len", "max", "min", "tuple", "list", "int", "abs", "sum", "any", "all", "zip", "enumerate")
#: lines one build-time evaluation may execute before it is left to run time
_BUDGET = 10_000
#: the longest literal (as source) an evaluation may leave in the module
_LONGEST = 200


def fold_calls(tree: ast.Module, roots: tuple[str, ...] = ("run",), facts: dict[int, tuple] | None = None) -> set[int]:
    """Apply the folds above to ``tree``'s functions in place; the ids of the top-level
    statements that changed. ``roots``: the functions called from outside the module.
    ``facts``: what an earlier round found of each function, by id (whether it is pure, the
    strings it returns), kept across the rounds of one prune; the caller drops the entries of
    the functions a round changed, as this does of those it changes."""
    defs = _module_functions(tree)
    facts = {} if facts is None else facts
    for f in defs.values():
        if id(f) not in facts:
            facts[id(f)] = (_is_pure(f), _returned_strings(f))
    pure = {name for name, f in defs.items() if facts[id(f)][0]}
    strings = {name: s for name, f in defs.items() if (s := facts[id(f)][1]) is not None}
    changed: set[int] = set()
    for stmt in tree.body:
        if not isinstance(stmt, ast.FunctionDef):
            continue
        evaluated = _Evaluate({n: defs[n] for n in pure if n != stmt.name})
        evaluated.visit(stmt)
        decided = _decide_strings(stmt, strings)
        tested = _Truth()
        tested.visit(stmt)
        if evaluated.changed or decided or tested.changed:
            changed.add(id(stmt))
    changed |= _bind_constant_arguments(tree, {n: f for n, f in defs.items() if n not in roots})
    for key in changed:
        facts.pop(key, None)
    return changed


def _bind_constant_arguments(tree: ast.Module, defs: dict[str, ast.FunctionDef]) -> set[int]:
    """Parameters every call passes the same literal (or leaves at the same literal default),
    substituted in the function's body and dropped from the def and its calls (see the module's
    docstring); the ids of the top-level statements that changed. Dropping a literal argument
    leaves the others in their order, so they are evaluated as before."""
    calls: dict[str, list[ast.Call]] = {name: [] for name in defs}
    callees: set[int] = set()
    holder: dict[int, str] = {}  # id of a call -> the name of the top-level statement holding it
    names: list[ast.Name] = []
    for top in tree.body:
        for node in walk(top):
            if isinstance(node, ast.Name) and node.id in calls:
                names.append(node)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in calls:
                calls[node.func.id].append(node)
                callees.add(id(node.func))
                holder[id(node)] = getattr(top, "name", "")
    escaped = {n.id for n in names if id(n) not in callees}
    edited: set[str] = set()
    for name, function in defs.items():
        args = function.args
        if (
            name in escaped
            or not calls[name]
            or function.decorator_list
            or args.vararg
            or args.kwarg
            or args.posonlyargs
            or args.kwonlyargs
        ):
            continue
        params = [a.arg for a in args.args]
        defaults = dict(zip(params[len(params) - len(args.defaults) :], args.defaults, strict=True))
        if any(
            len(c.args) > len(params)
            or any(isinstance(a, ast.Starred) for a in c.args)
            or any(k.arg is None or k.arg not in params for k in c.keywords)
            for c in calls[name]
        ):
            continue  # a call that raises as written, or passes what cannot be seen: left alone
        bound: dict[str, object] = {}
        for index, param in enumerate(params):
            values = [_given(c, index, param, defaults) for c in calls[name]]
            if all(v is not _MISSING and _is_literal(v) for v in values) and len({_tag(v) for v in values}) == 1:
                bound[param] = values[0]
        if bound:  # only a parameter the body never rebinds (nor a nested scope's own) is bound
            rebound = set()
            for n in walk(function):
                if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                    rebound.add(n.id)
                elif n is not function:
                    rebound.update(a.arg for a in _params_of(n))
            bound = {p: v for p, v in bound.items() if p not in rebound}
        if not bound:
            continue
        function.body = [_Bind(bound).visit(stmt) for stmt in function.body]
        for call in calls[name]:
            call.args = [a for i, a in enumerate(call.args) if params[i] not in bound]
            call.keywords = [k for k in call.keywords if k.arg not in bound]
        kept = [a for a in args.args if a.arg not in bound]
        args.args = kept
        args.defaults = [defaults[a.arg] for a in kept if a.arg in defaults]
        edited.add(name)
        edited.update(holder[id(c)] for c in calls[name])
    return {id(s) for s in tree.body if getattr(s, "name", None) in edited}


def _params_of(node: ast.AST) -> list[ast.arg]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return [a for a in walk(node.args) if isinstance(a, ast.arg)]
    return []


def _given(call: ast.Call, index: int, param: str, defaults: dict[str, ast.expr]) -> Any:
    """The literal ``call`` passes for the parameter at ``index`` (or its default), else ``_MISSING``."""
    if index < len(call.args):
        return literal(call.args[index])
    for keyword in call.keywords:
        if keyword.arg == param:
            return literal(keyword.value)
    return literal(defaults[param]) if param in defaults else _MISSING


def _module_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Top-level functions bound once in the module (a name bound twice means nothing certain)."""
    bound = Counter(
        name
        for stmt in tree.body
        for name in (
            [stmt.name]
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            else [n.id for n in walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        )
    )
    return {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef) and bound[s.name] == 1}


def _is_pure(function: ast.FunctionDef) -> bool:
    """Reads only its parameters, its locals and :data:`_SAFE` builtins; calls only those builtins
    and ``append`` on its own lists; no decorators, defaults, nested scopes, imports or yields."""
    args = function.args
    if (
        function.decorator_list
        or args.vararg
        or args.kwarg
        or args.kwonlyargs
        or args.posonlyargs
        or args.defaults
        or function.returns
    ):
        return False
    params = {a.arg for a in args.args}
    local = {n.id for n in walk(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    if local & set(_SAFE):
        return False
    for node in walk(function):
        if node is function:
            continue
        if isinstance(
            node,
            (
                ast.FunctionDef,
                ast.AsyncFunctionDef,
                ast.Lambda,
                ast.ClassDef,
                ast.Import,
                ast.ImportFrom,
                ast.Global,
                ast.Nonlocal,
                ast.Yield,
                ast.YieldFrom,
                ast.Await,
                ast.Try,
                ast.With,
                ast.Delete,
            ),
        ):
            return False
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id not in params and node.id not in local and node.id not in _SAFE:
                return False
        if isinstance(node, ast.Attribute):
            if not (node.attr == "append" and isinstance(node.value, ast.Name) and node.value.id in local):
                return False
        if isinstance(node, ast.Call):
            f = node.func
            if not (isinstance(f, ast.Name) and f.id in _SAFE) and not isinstance(f, ast.Attribute):
                return False
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                return False
    return True


class _Evaluate(Transformer):
    """Calls of pure module functions with literal arguments, replaced by their results."""

    def __init__(self, pure: dict[str, ast.FunctionDef]):
        self.pure, self.changed = pure, False
        self._compiled: dict[str, Any] = {}

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if not isinstance(f, ast.Name) or f.id not in self.pure or node.keywords:
            return node
        args = [literal(a) for a in node.args]
        if any(a is _MISSING for a in args) or len(args) != len(self.pure[f.id].args.args):
            return node
        value = _bounded_call(self._function(f.id), args)
        if value is _MISSING or not _is_literal(value) or len(repr(value)) > _LONGEST:
            return node
        self.changed = True
        return ast.copy_location(_literal_node(value), node)

    def _function(self, name: str) -> Any:
        if name not in self._compiled:
            module = ast.Module([self.pure[name]], [])
            namespace: dict[str, Any] = {"__builtins__": {n: getattr(builtins, n) for n in _SAFE}}
            exec(compile(ast.fix_missing_locations(module), "<build-time>", "exec"), namespace)  # noqa: S102 - a pure function of literals (checked by _is_pure), over safe builtins only
            self._compiled[name] = namespace[name]
        return self._compiled[name]


class _OverBudget(Exception):
    pass


def _bounded_call(function: Any, args: list[Any]) -> Any:
    """``function(*args)``, or ``_MISSING`` when it raises or runs past :data:`_BUDGET` lines
    (left to run time, where it behaves as written)."""
    steps = [0]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != "<build-time>":
            return None
        if event == "line":
            steps[0] += 1
            if steps[0] > _BUDGET:
                raise _OverBudget
        return trace

    previous = sys.gettrace()  # a debugger's or coverage's, put back after
    sys.settrace(trace)
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - left to run time, where it raises as written
        return _MISSING
    finally:
        sys.settrace(previous)


def _strings(node: ast.expr) -> frozenset[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return frozenset({node.value})
    if isinstance(node, ast.IfExp):
        body, orelse = _strings(node.body), _strings(node.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def _returned_strings(function: ast.FunctionDef) -> frozenset[str] | None:
    """The strings ``function`` can return, when every return returns one and it cannot fall off
    its end; else None."""
    nested = [n for n in walk(function) if n is not function and isinstance(n, (ast.FunctionDef, ast.Lambda))]
    if nested or any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in walk(function)):
        return None
    if not function.body or not isinstance(function.body[-1], (ast.Return, ast.Raise)):
        return None
    found: frozenset[str] = frozenset()
    for node in walk(function):
        if isinstance(node, ast.Return):
            values = None if node.value is None else _strings(node.value)
            if values is None:
                return None
            found |= values
    return found


def _decide_strings(function: ast.FunctionDef, strings: dict[str, frozenset[str]]) -> bool:
    """Comparisons with a string of locals assigned once, at the top of ``function``'s body, from a
    call whose returns are all strings: decided where the strings it can return decide them."""
    stored = Counter(n.id for n in walk(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load))
    stored.update(a.arg for a in walk(function.args) if isinstance(a, ast.arg))
    known: dict[str, frozenset[str]] = {}
    changed = False
    for index, stmt in enumerate(function.body):
        if known:
            decider = _Compare(known)
            function.body[index] = decider.visit(stmt)
            changed |= decider.changed
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stored[stmt.targets[0].id] == 1
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id in strings
        ):
            known[stmt.targets[0].id] = strings[stmt.value.func.id]
    return changed


class _Compare(Transformer):
    def __init__(self, known: dict[str, frozenset[str]]):
        self.known, self.changed = known, False

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        left, right = node.left, node.comparators[0]
        if isinstance(right, ast.Name) and isinstance(left, ast.Constant):
            left, right = right, left
        if not (isinstance(left, ast.Name) and left.id in self.known and isinstance(right, ast.Constant)):
            return node
        values = self.known[left.id]
        if right.value in values and values != {right.value}:
            return node  # either way at run time
        equal = values == {right.value}
        self.changed = True
        return ast.copy_location(ast.Constant(equal if isinstance(node.ops[0], ast.Eq) else not equal), node)


def _quiet(node: ast.expr) -> bool:
    """Evaluating ``node`` has no effect to keep: names, literals, attributes of names, comparisons
    of those (what a test skipped by a decided ``and``/``or`` may be)."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _quiet(node.value)
    if isinstance(node, ast.Compare):
        return _quiet(node.left) and all(_quiet(c) for c in node.comparators)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _quiet(node.operand)
    return False


class _Truth(Transformer):
    """Tests of ``if``, ``while`` and ``x if c else y`` read for their truth: literal operands of an
    ``and``/``or`` that do not decide it are dropped; one that decides it decides the test when
    every operand before it is quiet."""

    changed = False

    def _test(self, node: ast.expr) -> ast.expr:
        if not isinstance(node, ast.BoolOp):
            return node
        decides = isinstance(node.op, ast.Or)  # the truth that ends an `or`; falsity ends an `and`
        kept: list[ast.expr] = []
        for operand in node.values:
            operand = self._test(operand)
            value = literal(operand)
            if value is _MISSING:
                kept.append(operand)
                continue
            if bool(value) != decides:
                continue  # evaluation goes on: it adds nothing to the truth
            if all(_quiet(k) for k in kept):
                self.changed = True
                return ast.copy_location(ast.Constant(decides), node)
            kept.append(operand)
            break
        if len(kept) == len(node.values):
            return node
        self.changed = True
        if not kept:
            return ast.copy_location(ast.Constant(not decides), node)
        return kept[0] if len(kept) == 1 else ast.copy_location(ast.BoolOp(node.op, kept), node)

    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        node.test = self._test(node.test)
        return node

    visit_While = visit_If  # type: ignore[assignment]  # the same test field
    visit_IfExp = visit_If  # type: ignore[assignment]  # the same test field
