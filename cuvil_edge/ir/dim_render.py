"""The text of a symbolic dim (:class:`cuvil_edge.ir.dims.Expr`): its canonical order of terms and
factors, and the fewest parentheses that read back as the same expression (``a//(b*c)``, not
``a//b*c``). :mod:`cuvil_edge.ir.dim_parser` reads this text back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cuvil_edge.ir.dims import Expr

#: Atoms written as function calls; the others (``//``, ``%``) as infix operators.
FUNCTIONS = ("min", "max")


def factor_key(factor) -> tuple:
    return (0, factor) if isinstance(factor, str) else (1, _render_atom(factor, str))


def _render_atom(atom: tuple, name: Callable[[str], str]) -> str:
    kind, args = atom
    # str() of an argument is its render with plain names, kept by the Expr once made: without it,
    # sorting a monomial's factors (``factor_key``) rendered every nested atom again at every level
    a, b = (str(x) if name is str else render(x, name) for x in args)
    if kind in FUNCTIONS:
        return f"{kind}({a},{b})"
    return f"({_wrap(args[0], a, False)}{kind}{_wrap(args[1], b, True)})"


def _wrap(e: Expr, text: str, right: bool) -> str:
    """Parentheses where the text would read otherwise: a sum on either side, and on the right of
    ``//`` or ``%`` anything but one factor or a constant (``a//(b*c)``, not ``a//b*c``)."""
    if len(e.terms) > 1 or any(c < 0 for c in e.terms.values()):
        return f"({text})"
    if right and e.terms and not e.is_const():
        ((monomial, coefficient),) = e.terms.items()
        if coefficient != 1 or len(monomial) > 1:
            return f"({text})"
    return text


def render(e: Expr, name: Callable[[str], str] = str) -> str:
    if not e.terms:
        return "0"
    ordered = sorted(e.terms.items(), key=lambda item: (-len(item[0]), [factor_key(f) for f in item[0]]))
    out = ""
    for monomial, coefficient in ordered:
        factors = [name(f) if isinstance(f, str) else _render_atom(f, name) for f in monomial]
        magnitude = abs(coefficient)
        if magnitude != 1 or not factors:
            factors.insert(0, str(magnitude))
        text = "*".join(factors)
        if coefficient < 0:
            out += f"-{text}"
        else:
            out += f"+{text}" if out else text
    return out
