"""``ast.walk`` and ``ast.NodeTransformer`` as the build's passes use them, without the standard
library's per-node overhead.

A device compiles its package itself, and the passes over a generated module (specialising,
folding, pruning) walk every node of it many times. The standard library spends most of that
time in machinery, not in the passes: two nested generators per node (``iter_child_nodes`` over
``iter_fields``), a string concatenation and attribute lookup to dispatch each visit, and a visit
of every context and operator node (``Load``, ``Add``), which has no children and which no pass
looks at. These versions do the same in the same order, with none of that: the build's module
is byte-identical, only sooner.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from typing import Any

_AST = ast.AST


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` (itself first), breadth first, as :func:`ast.walk` yields them."""
    todo = deque([node])
    take, put = todo.popleft, todo.append
    while todo:
        node = take()
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, _AST):
                put(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, _AST):
                        put(item)
        yield node


class Transformer(ast.NodeTransformer):
    """:class:`ast.NodeTransformer` with its dispatch looked up once per pair of classes, and
    nodes without fields (contexts, operators) not visited unless the pass has a ``visit_`` method
    for them. So a subclass's ``generic_visit`` must leave such a node as it is, as the standard
    one does."""

    # (transformer class, node class) -> the unbound visit method, or None: nothing to visit
    _dispatch: dict[tuple[type, type], Any] = {}

    @classmethod
    def _method(cls, kind: type[ast.AST]) -> Any:
        method = getattr(cls, "visit_" + kind.__name__, None)
        if method is None or method is ast.NodeVisitor.visit_Constant:  # the shim for visit_Num & co.
            return None if not kind._fields else cls.generic_visit
        return method

    def visit(self, node: ast.AST) -> Any:
        key = (type(self), type(node))
        try:
            method = self._dispatch[key]
        except KeyError:
            method = self._dispatch[key] = type(self)._method(type(node))
        return node if method is None else method(self, node)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        visit, dispatch, cls = self.visit, self._dispatch, type(self)
        for name in node._fields:
            old = getattr(node, name, None)
            if isinstance(old, list):
                new: list[Any] = []
                for value in old:
                    if isinstance(value, _AST):
                        if dispatch.get((cls, type(value)), visit) is None:  # a field-less node no pass visits
                            new.append(value)
                            continue
                        value = visit(value)
                        if value is None:
                            continue
                        if not isinstance(value, _AST):
                            new.extend(value)
                            continue
                    new.append(value)
                old[:] = new
            elif isinstance(old, _AST):
                if dispatch.get((cls, type(old)), visit) is None:
                    continue
                replaced = visit(old)
                if replaced is None:
                    delattr(node, name)
                elif replaced is not old:
                    setattr(node, name, replaced)
        return node
