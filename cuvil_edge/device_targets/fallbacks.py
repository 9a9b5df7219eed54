"""Declared fallbacks: the code a kernel keeps for inputs other than the ones most calls see.

A generated module holds only what its call sites can run: what the build can decide is folded
away (:mod:`.prune`, :mod:`.fold_locals`, :mod:`.fold_calls`). What is left unrun by a given
input is either a fallback (a typed error for a failed native allocation, an empty-input guard,
the bias epilogue only outputs of 32k elements take) or code the build should have removed. A
kernel says which by a comment::

    if x.size == 0:  # fallback: an empty input has no rows to normalise
        return x.copy()

    # fallback: a pad the windows need is copied in
    padded = np.full(shape, fill, dtype=x.dtype)

A ``# fallback: <why>`` comment declares the statements from the next one after it to the end of
that statement's block: trailing an ``if``/``elif``/``else`` header, the branch's body; on a line
of its own, the rest of the block. Each one must say why it is there (an empty reason is a
:class:`BuildError`): a declaration covers one branch or one tail, never a kernel, and the
reason is kept with it in the generated module.

Comments do not survive :func:`ast.unparse`, which renders every specialised kernel copy, so
:func:`declare` turns each into a statement at the start of what it declares: the string
``'fallback: <why>'``. A constant expression statement compiles to one ``NOP`` (CPython keeps
it for the line event a tracer sees, nothing else), so the marker costs about nothing at run
time; and being part of the tree, it goes wherever the branch goes: a branch folded away takes
its marker with it, and the module the build writes (and caches) says itself what it declares.
The alternative, a line set the build returns, would have to be carried through every fold that
moves lines, and kept next to the cached module.

:func:`declared_lines` reads a module's markers back: the lines of what each declares, and the
bodies of the module functions called only from declared code (``_native_epilogue_1``, called
from the declared epilogue ``if`` alone), for a coverage check to hold its unrun lines against.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

from cuvil_edge.device_targets.ast_walk import walk
from cuvil_edge.errors import BuildError

#: how a marker statement's string starts
MARK = "fallback: "
_COMMENT = re.compile(r"#\s*fallback:(.*)$")  # matched on a comment token; searched on a line
#: _comments' memo: source -> its (line, reason) pairs (a build specialises each kernel per site)
_SEEN: dict[str, tuple[tuple[int, str], ...]] = {}
_SEEN_SIZE = 1024
_SEEN_LONGEST = 20_000
#: a header line past any source: a block without one (a ``case``) takes no comment before it
_NOWHERE = 1 << 30


@dataclass(frozen=True)
class Fallback:
    """One marker of a module: its line, why it is there, and the lines it declares."""

    line: int
    reason: str
    lines: frozenset[int]


def is_marker(stmt: ast.AST) -> bool:
    """``stmt`` is a fallback marker statement (see the module docstring)."""
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
        and stmt.value.value.startswith(MARK)
    )


def _comments(source: str, tree: ast.Module) -> dict[int, str]:
    """Line -> reason of each ``# fallback:`` comment of ``source`` (``tree`` parsed from it).

    Only the top-level statements holding a line that looks like one are tokenized (to tell a
    comment from the same text in a string): a module is mostly kernels that declare nothing, and
    tokenizing all of it costs more than the rest of declaring.

    Raises:
        BuildError: a fallback comment gives no reason.
    """
    found: dict[int, str] = {}
    if "fallback:" not in source:  # most kernels declare nothing
        return found
    seen = _SEEN.get(source)
    if seen is not None:  # a kernel's source, specialised again for another call site
        return dict(seen)
    lines = source.splitlines(keepends=True)
    candidates = [n for n, line in enumerate(lines, 1) if _COMMENT.search(line)]
    if not candidates:
        return found
    tokens: list[tokenize.TokenInfo] = []
    for top in tree.body:
        first, last = top.lineno, top.end_lineno or top.lineno
        if not any(first <= n <= last for n in candidates):
            continue
        text = io.StringIO("".join(lines[first - 1 : last]))
        try:
            tokens.extend(
                t._replace(start=(t.start[0] + first - 1, t.start[1])) for t in tokenize.generate_tokens(text.readline)
            )
        except (tokenize.TokenError, SyntaxError):  # it parsed, so this is unexpected: declare nothing here
            continue
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = _COMMENT.match(token.string)
        if match is None:
            continue
        reason = match.group(1).strip()
        if not reason:
            raise BuildError(f"line {token.start[0]}: a fallback comment must say why the code is there")
        found[token.start[0]] = reason
    if len(source) <= _SEEN_LONGEST:  # a kernel's, not a whole module's (each built once)
        if len(_SEEN) >= _SEEN_SIZE:
            _SEEN.clear()
        _SEEN[source] = tuple(found.items())
    return found


def _blocks(node: ast.AST) -> Iterator[tuple[ast.AST, str, list[ast.stmt]]]:
    """Every statement block under ``node``: (the node holding it, its field, the block)."""
    for parent in walk(node):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield parent, field, block


def declare(tree: ast.Module, source: str) -> set[int]:
    """Turn the fallback comments of ``source`` (which ``tree`` was parsed from) into marker
    statements; the ids of ``tree``'s top-level statements that got one.

    Raises:
        BuildError: a fallback comment gives no reason.
    """
    comments = _comments(source, tree)
    if not comments:
        return set()
    changed: set[int] = set()
    for top in tree.body:
        if not any(top.lineno <= n <= (top.end_lineno or top.lineno) for n in comments):
            continue
        for parent, field, block in list(_blocks(top)):
            start = _header(parent, field)
            inserted = 0
            for index, stmt in enumerate(list(block)):
                # the gap before each statement: its block's header lines, or the lines between it
                # and the statement before it (comments on lines of their own)
                lines = [line for line in comments if start <= line < stmt.lineno]
                start = (stmt.end_lineno or stmt.lineno) + 1
                if not lines:
                    continue
                reason = "; ".join(comments.pop(line) for line in sorted(lines))
                at = index + inserted
                if at == 0 and isinstance(parent, ast.FunctionDef) and _is_docstring(stmt):
                    at = 1  # a def's docstring stays its docstring
                if is_marker(block[at]) if at < len(block) else False:
                    continue  # declared already (a module pruned again)
                marker = ast.Expr(ast.Constant(MARK + reason))
                block.insert(at, ast.copy_location(marker, stmt))
                inserted += 1
                changed.add(id(top))
    return changed


def _header(parent: ast.AST, field: str) -> int:
    """The first line of the header of ``parent``'s block ``field`` (``if ...:``, ``else:``)."""
    if field == "body":
        return getattr(parent, "lineno", _NOWHERE)
    before = {"orelse": ("body",), "finalbody": ("body", "handlers", "orelse")}[field]
    ends = [s.end_lineno or s.lineno for f in before for s in getattr(parent, f, [])]
    return max(ends) + 1 if ends else _NOWHERE


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _span(stmt: ast.stmt) -> set[int]:
    return set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))


def fallbacks(source: str) -> list[Fallback]:
    """The markers of a generated module, each with the lines of the statements it declares (its
    own line not among them: it runs no code)."""
    tree = ast.parse(source)
    found = []
    for _, _, block in _blocks(tree):
        for index, stmt in enumerate(block):
            if is_marker(stmt):
                lines: set[int] = set()
                for declared in block[index + 1 :]:
                    lines |= _span(declared)
                reason = stmt.value.value.removeprefix(MARK)  # type: ignore[attr-defined]  # a marker: checked
                found.append(Fallback(stmt.lineno, reason, frozenset(lines)))
    return sorted(found, key=lambda f: f.line)


def declared_lines(source: str) -> dict[int, str]:
    """Line -> reason for every line a marker of the module declares, and every line of a
    module function that only declared code calls (its reason: the fallbacks that call it)."""
    tree = ast.parse(source)
    covered: dict[int, str] = {}
    inside: set[int] = set()  # ids of the nodes in declared code
    for parent, _, block in _blocks(tree):
        for index, stmt in enumerate(block):
            if not is_marker(stmt):
                continue
            reason = stmt.value.value.removeprefix(MARK)  # type: ignore[attr-defined]  # a marker: checked
            tail = block[index + 1 :]
            if index == 0 and isinstance(parent, ast.If) and block is parent.body:
                inside.update(id(n) for n in walk(parent.test))  # a call in the test runs for it
            for declared in tail:
                inside.update(id(n) for n in walk(declared))
                covered.update(dict.fromkeys(_span(declared), reason))
    functions = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    uses: dict[str, list[ast.Name]] = {name: [] for name in functions}
    for node in walk(tree):
        if isinstance(node, ast.Name) and node.id in uses:
            uses[node.id].append(node)
    done: set[str] = set()
    while True:
        fresh = [
            name for name, refs in uses.items() if name not in done and refs and all(id(r) in inside for r in refs)
        ]
        if not fresh:
            return covered
        for name in fresh:
            done.add(name)
            function = functions[name]
            for stmt in function.body:
                inside.update(id(n) for n in walk(stmt))
                covered.update(dict.fromkeys(_span(stmt), f"called only from declared fallbacks ({name})"))
