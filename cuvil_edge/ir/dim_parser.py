"""The parser of dim texts (:mod:`cuvil_edge.ir.dims`): a small recursive descent over integers,
symbols, ``+ - * // %``, ``min()``, ``max()`` and parentheses, with limits on length, nesting and
(through :class:`~cuvil_edge.ir.dims.Expr`) terms. A dim in a package comes from outside the
device, so nothing here evaluates text as code.
"""

from __future__ import annotations

import re
from functools import lru_cache

from cuvil_edge.ir.dim_render import FUNCTIONS
from cuvil_edge.ir.dims import MAX_DEPTH, MAX_TEXT, SYMBOL, DimError, Expr, floordiv, maximum, minimum, mod

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*%(),]))")


@lru_cache(maxsize=4096)
def parse_text(text: str) -> Expr:
    """The expression a dim text stands for.

    Raises:
        DimError: not text, too long, nested too deep, or not an integer expression over symbols.
    """
    if not isinstance(text, str) or not text or len(text) > MAX_TEXT:
        raise DimError(
            f"{text!r:.80} is not a dim: a symbol or an integer expression of at most {MAX_TEXT} characters is"
        )
    tokens: list[str] = []
    position = 0
    while position < len(text):
        if text[position:].isspace():
            break
        match = _TOKEN.match(text, position)
        if match is None:
            raise DimError(
                f"dim {text!r:.80} has {text[position]!r} at {position}; a dim uses symbols, integers, "
                "+ - * // %, min(), max() and parentheses"
            )
        tokens.append(match.group(match.lastindex))  # type: ignore[arg-type]  # each alternative is a group
        position = match.end()
    parser = _Parser(text, tokens)
    value = parser.expr(0)
    if parser.at < len(tokens):
        raise DimError(f"dim {text!r:.80} has {tokens[parser.at]!r} where it should end")
    return value


class _Parser:
    def __init__(self, text: str, tokens: list[str]) -> None:
        self.text, self.tokens, self.at = text, tokens, 0

    def _fail(self, what: str) -> DimError:
        return DimError(f"dim {self.text!r:.80}: {what}")

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self, token: str) -> None:
        if self._peek() != token:
            raise self._fail(f"expected {token!r}")
        self.at += 1

    def expr(self, depth: int) -> Expr:
        if depth > MAX_DEPTH:
            raise self._fail(f"nested more than {MAX_DEPTH} deep")
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            sign = self.tokens[self.at]
            self.at += 1
            right = self.term(depth)
            value = value + right if sign == "+" else value - right
        return value

    def term(self, depth: int) -> Expr:
        value = self.unary(depth)
        while self._peek() in ("*", "//", "%"):
            op = self.tokens[self.at]
            self.at += 1
            right = self.unary(depth)
            try:
                value = value * right if op == "*" else floordiv(value, right) if op == "//" else mod(value, right)
            except ZeroDivisionError as e:
                raise self._fail(str(e)) from None
        return value

    def unary(self, depth: int) -> Expr:
        if self._peek() == "-":
            self.at += 1
            if depth + 1 > MAX_DEPTH:
                raise self._fail(f"nested more than {MAX_DEPTH} deep")
            return -self.unary(depth + 1)
        return self.primary(depth)

    def primary(self, depth: int) -> Expr:
        token = self._peek()
        if token is None:
            raise self._fail("ends too early")
        self.at += 1
        if token.isdigit():
            return Expr.const(int(token))
        if token == "(":
            value = self.expr(depth + 1)
            self._take(")")
            return value
        if token in FUNCTIONS and self._peek() == "(":
            self.at += 1
            a = self.expr(depth + 1)
            self._take(",")
            b = self.expr(depth + 1)
            self._take(")")
            return minimum(a, b) if token == "min" else maximum(a, b)
        if SYMBOL.match(token):
            return Expr.symbol(token)
        raise self._fail(f"unexpected {token!r}")
