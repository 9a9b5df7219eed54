"""Symbolic dims: integer expressions over named symbols (``batch``, ``seq``).

A dim of a :class:`~cuvil_edge.ir.graph.TensorType` is an ``int`` or the canonical text of an
:class:`Expr`: a polynomial with integer coefficients over symbols and *atoms* that do not expand,
``(e//k)``, ``(e%k)``, ``min(a,b)``, ``max(a,b)``; ``batch*(seq+1)`` is ``batch*seq+batch``.
Equal texts are equal for every binding; :func:`same` also finds one size written two ways.

What the algebra knows: a symbol is a size, at least 1 (``max(batch, 1)`` is ``batch``); ``x % k``
is congruent to ``x``, so a size padded up to a multiple of ``k`` divides by ``k``. Division is
floor division, which for sizes equals ONNX's truncating integer ``Div``. Where the ops take a
size on trust (see their docstrings) the interpreter checks it when it runs.

Text is read by :mod:`cuvil_edge.ir.dim_parser` (bounded; never ``eval``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping

from cuvil_edge.ir.dim_render import FUNCTIONS, factor_key, render

Dim = int | str

#: Longest dim text accepted (a package carries graph input and output dims as text).
MAX_TEXT = 2048
#: Most terms one expression may have (a product of sums expands; a bound keeps crafted text finite).
MAX_TERMS = 64
#: Deepest nesting of parentheses, atoms and unary minus accepted.
MAX_DEPTH = 32
#: A symbol: what ONNX exporters write as ``dim_param`` (``batch_size``, ``s0``, ``N``);
#: the frontend renames anything else to this form.
SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class DimError(ValueError):
    """A dim text that is not an integer expression over symbols (the caller names where)."""


class Expr:
    """An immutable polynomial: ``{monomial: coefficient}``, a monomial being a sorted tuple
    of factors (a symbol name, or an atom ``(kind, args)``; repeated for powers)."""

    __slots__ = ("terms", "_text")

    def __init__(self, terms: Mapping[tuple, int]) -> None:
        self.terms = {m: c for m, c in terms.items() if c}
        if len(self.terms) > MAX_TERMS:
            raise DimError(
                f"a dim expression grew past {MAX_TERMS} terms; the model's shape arithmetic is too "
                "involved to follow symbolically (fix an axis when exporting)"
            )
        self._text: str | None = None

    # construction
    @staticmethod
    def const(value: int) -> Expr:
        return Expr({(): int(value)})

    @staticmethod
    def symbol(name: str) -> Expr:
        return Expr({(name,): 1})

    @staticmethod
    def of(dim: Dim | Expr) -> Expr:
        if isinstance(dim, Expr):
            return dim
        if isinstance(dim, bool):
            raise DimError(f"{dim!r} is not a dim")
        if isinstance(dim, int):
            return Expr.const(dim)
        return parse(dim)

    # queries
    def is_const(self) -> bool:
        return all(not m for m in self.terms)

    def constant(self) -> int:
        return self.terms.get((), 0)

    def symbols(self) -> frozenset[str]:
        found: set[str] = set()
        for monomial in self.terms:
            for factor in monomial:
                if isinstance(factor, str):
                    found.add(factor)
                else:
                    for arg in factor[1]:
                        found |= arg.symbols()
        return frozenset(found)

    def to_dim(self) -> Dim:
        """The int when constant, else the canonical text."""
        return self.constant() if self.is_const() else str(self)

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        """The value for ``bindings``; raises KeyError naming a symbol it lacks."""
        total = 0
        for monomial, coefficient in self.terms.items():
            value = coefficient
            for factor in monomial:
                value *= bindings[factor] if isinstance(factor, str) else _evaluate_atom(factor, bindings)
            total += value
        return total

    def substitute(self, bindings: Mapping[str, int]) -> Expr:
        """Bound symbols replaced by their values; the others stay."""
        if not self.symbols() & set(bindings):
            return self
        out = Expr.const(0)
        for monomial, coefficient in self.terms.items():
            term = Expr.const(coefficient)
            for factor in monomial:
                if isinstance(factor, str):
                    term = term * (Expr.const(bindings[factor]) if factor in bindings else Expr.symbol(factor))
                else:
                    args = [a.substitute(bindings) for a in factor[1]]
                    term = term * _ATOM_OPS[factor[0]](*args)
            out = out + term
        return out

    def lower_bound(self) -> int | None:
        """A lower bound from symbols >= 1 (``x % k`` >= 0, ``x // k`` >= 0 for x >= 0), when every
        term with a negative coefficient is constant; else None (such a term can be anything)."""
        bound = self.constant()
        for monomial, coefficient in self.terms.items():
            if not monomial:
                continue
            low = 1
            for factor in monomial:
                f = 1 if isinstance(factor, str) else _atom_lower_bound(factor)
                if f is None or f < 0:
                    return None
                low *= f
            if coefficient < 0:
                return None
            bound += coefficient * low
        return bound

    # arithmetic
    def __add__(self, other: Expr | int) -> Expr:
        other = Expr.of(other)
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Expr(terms)

    def __neg__(self) -> Expr:
        return Expr({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Expr | int) -> Expr:
        return self + (-Expr.of(other))

    def __mul__(self, other: Expr | int) -> Expr:
        other = Expr.of(other)
        terms: dict[tuple, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2, key=factor_key))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Expr(terms)

    def __radd__(self, other: int) -> Expr:
        return self + other

    def __rsub__(self, other: int) -> Expr:
        return Expr.of(other) - self

    def __rmul__(self, other: int) -> Expr:
        return self * other

    def __floordiv__(self, other: Expr | int) -> Expr:
        return floordiv(self, Expr.of(other))

    def __mod__(self, other: Expr | int) -> Expr:
        return mod(self, Expr.of(other))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(str(self))

    def __str__(self) -> str:
        if self._text is None:
            self._text = render(self)
        return self._text

    def __repr__(self) -> str:
        return f"Expr({str(self)!r})"

    def python(self, name: Callable[[str], str]) -> str:
        """Python source computing the value, each symbol written as ``name(symbol)``."""
        return render(self, name)


def _atom(kind: str, *args: Expr) -> Expr:
    if kind in FUNCTIONS:
        args = tuple(sorted(args, key=str))
    return Expr({((kind, tuple(args)),): 1})


def floordiv(a: Expr, b: Expr) -> Expr:
    """``a // b``, exact where the division is (a multiple of ``b`` plus a constant remainder)."""
    if b.is_const():
        k = b.constant()
        if k == 0:
            raise ZeroDivisionError("a dim divided by zero")
        if k < 0:
            return floordiv(-a, Expr.const(-k))
        offset = a.constant()
        if multiple_of(a - offset, k):  # the part a size that was rounded up to k would have
            a, carry = a - offset, Expr.const(offset // k)
        else:
            carry = Expr.const(0)
        exact = Expr({m: c for m, c in a.terms.items() if c % k == 0})
        rest = a - exact
        quotient = Expr({m: c // k for m, c in exact.terms.items()}) + carry
        if rest.is_const():
            return quotient + rest.constant() // k
        return quotient + _atom("//", rest, b)
    exact_quotient = divide_exactly(a, b)
    return exact_quotient if exact_quotient is not None else _atom("//", a, b)


def mod(a: Expr, b: Expr) -> Expr:
    """``a % b``: the remainder left after the exact part of the division."""
    if b.is_const():
        k = b.constant()
        if k == 0:
            raise ZeroDivisionError("a dim modulo zero")
        if k < 0:
            return -mod(-a, Expr.const(-k))
        rest = _reduced(a, k)
        rest = Expr({m: c % k for m, c in rest.terms.items()})
        if rest.is_const():
            return Expr.const(rest.constant() % k)
        return _atom("%", rest, b)
    if divide_exactly(a, b) is not None:
        return Expr.const(0)
    return _atom("%", a, b)


def _reduced(a: Expr, k: int) -> Expr:
    """``a`` with every ``(y % k)`` replaced by ``y``: congruent to ``a`` modulo ``k``."""
    if not any(_is_mod(f, k) for m in a.terms for f in m):
        return a
    out = Expr.const(0)
    for monomial, coefficient in a.terms.items():
        term = Expr.const(coefficient)
        for factor in monomial:
            term = term * (factor[1][0] if _is_mod(factor, k) else Expr({(factor,): 1}))
        out = out + term
    return out


def _is_mod(factor, k: int) -> bool:
    return not isinstance(factor, str) and factor[0] == "%" and factor[1][1] == Expr.const(k)


def multiple_of(a: Expr, k: int) -> bool:
    """``a`` is a multiple of ``k`` for every binding: ``H + (7 - H%7)%7`` (a size padded up to a
    multiple of 7) is, because ``H%7`` is congruent to ``H``."""
    return all(c % k == 0 for c in _reduced(a, k).terms.values())


def minimum(a: Expr, b: Expr) -> Expr:
    if provably_le(a, b):
        return a
    return b if provably_le(b, a) else _atom("min", a, b)


def maximum(a: Expr, b: Expr) -> Expr:
    if provably_le(a, b):
        return b
    return a if provably_le(b, a) else _atom("max", a, b)


def provably_le(a: Expr, b: Expr) -> bool:
    """``a <= b`` for every binding of the symbols (each at least 1)."""
    low = (b - a).lower_bound()
    return low is not None and low >= 0


def provably_different(a: Expr, b: Expr) -> bool:
    """``a != b`` for every binding of the symbols (each at least 1): the difference has a positive
    bound, or its constant is no multiple of its other coefficients' gcd (``6*batch`` is never 20)."""
    gcd = math.gcd(*(c for m, c in (a - b).terms.items() if m))
    if gcd and (a - b).constant() % gcd:
        return True
    for diff in (a - b, b - a):
        low = diff.lower_bound()
        if low is not None and low > 0:
            return True
    return False


def divide_exactly(a: Expr, b: Expr) -> Expr | None:
    """``q`` with ``q * b == a`` as polynomials, or None (long division by ``b``'s leading term)."""
    if b.is_const():
        k = b.constant()
        if k and all(c % k == 0 for c in a.terms.values()):
            return Expr({m: c // k for m, c in a.terms.items()})
        return None
    lead_m, lead_c = max(b.terms.items(), key=lambda item: _monomial_order(item[0]))
    quotient, rest = Expr.const(0), a
    for _ in range(64):  # each step removes rest's leading term; a bound keeps bad input finite
        if not rest.terms:
            return quotient
        m, c = max(rest.terms.items(), key=lambda item: _monomial_order(item[0]))
        left = _divide_monomial(m, lead_m)
        if left is None or c % lead_c:
            return None
        step = Expr({left: c // lead_c})
        quotient, rest = quotient + step, rest - step * b
    return None


def _divide_monomial(m: tuple, d: tuple) -> tuple | None:
    left = list(m)
    for factor in d:
        if factor not in left:
            return None
        left.remove(factor)
    return tuple(left)


def _monomial_order(m: tuple) -> tuple:
    return (len(m), tuple(factor_key(f) for f in m))


def _atom_lower_bound(atom: tuple) -> int | None:
    kind, (x, y) = atom
    if kind == "%":
        return 0 if y.is_const() and y.constant() > 0 else None
    low_x, low_y = x.lower_bound(), y.lower_bound()
    if kind == "//":
        return low_x // y.constant() if low_x is not None and low_x >= 0 and y.is_const() and y.constant() > 0 else None
    if low_x is None or low_y is None:
        return None
    return min(low_x, low_y) if kind == "min" else max(low_x, low_y)


def _evaluate_atom(atom: tuple, bindings: Mapping[str, int]) -> int:
    kind, args = atom
    values = [a.evaluate(bindings) for a in args]
    if kind == "//":
        return values[0] // values[1]
    if kind == "%":
        return values[0] % values[1]
    return min(values) if kind == "min" else max(values)


_ATOM_OPS = {"//": floordiv, "%": mod, "min": minimum, "max": maximum}


#: Sizes tried for each symbol by :func:`same`: small ones (every residue of small moduli), the
#: common image and sequence sizes, and some primes; fixed, so inference is deterministic.
_SAMPLE_SIZES = (
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    12,
    13,
    14,
    15,
    16,
    17,
    23,
    24,
    31,
    32,
    48,
    49,
    56,
    64,
    97,
    100,
    112,
    128,
    224,
    256,
    384,
    512,
    1000,
    1024,
)
_SAMPLES = 48


def same(a: Dim, b: Dim) -> bool:
    """Whether two dims are equal for every binding, as far as the build can tell: equal texts, or
    equal values at a fixed set of bindings that covers small residues (expressions of floors and
    remainders that one model builds two ways, such as Swin's window count as ``(Hp//4)*(Wp//4)``
    and as ``(Hp*Wp)//16``). Where it is wrong the run's shapes disagree with the types, which the
    interpreter reports (node named)."""
    if a == b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return False
    x, y = Expr.of(a), Expr.of(b)
    if provably_different(x, y):
        return False
    names = sorted(x.symbols() | y.symbols())
    if not names:
        return x == y
    agree = 0
    for i in range(_SAMPLES * 2):
        binding = {
            n: _SAMPLE_SIZES[(i * (3 + 2 * j) + j * 7 + (i * i) % 5) % len(_SAMPLE_SIZES)] for j, n in enumerate(names)
        }
        try:
            if x.evaluate(binding) != y.evaluate(binding):
                return False
        except ZeroDivisionError:
            continue
        agree += 1
        if agree >= _SAMPLES:
            return True
    return False


def simpler(a: Dim, b: Dim) -> Dim:
    """Of two dims known to be :func:`same`, the one to keep: an int, else the shorter text."""
    if isinstance(a, int) or isinstance(b, int):
        return a if isinstance(a, int) else b
    return min(a, b, key=lambda d: (len(d), d))


def parse(text: str) -> Expr:
    """The expression a dim text stands for (:mod:`cuvil_edge.ir.dim_parser`).

    Raises:
        DimError: not text, too long, nested too deep, or not an integer expression over symbols.
    """
    from cuvil_edge.ir.dim_parser import parse_text  # the parser builds Exprs: it imports this module

    return parse_text(text)


def symbol_for(name: str, suffix: str) -> str:
    """A symbol made from a value name: ``count`` of ``idx`` is ``idx_count``; of ``/NonZero:0``,
    ``NonZero_0_<digest>_count`` (any character a symbol cannot hold makes the digest part of it)."""
    text = f"{name}_{suffix}"
    if SYMBOL.match(text) and len(text) <= 200:
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:120]
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{'s_' if not cleaned or cleaned[0].isdigit() else ''}{cleaned}_{digest}_{suffix}"


def canonical(dim: Dim) -> Dim:
    """The dim in canonical form: an int, or the canonical text (``"seq+1-1"`` is ``"seq"``)."""
    return dim if isinstance(dim, int) else parse(dim).to_dim()


def symbols_of(dim: Dim) -> frozenset[str]:
    return frozenset() if isinstance(dim, int) else parse(dim).symbols()


def product(dims) -> Dim:
    """The product of dims, canonical."""
    out = Expr.const(1)
    for d in dims:
        out = out * Expr.of(d)
    return out.to_dim()


def bind(dim: Dim, bindings: Mapping[str, int]) -> Dim:
    """Bound symbols replaced; an int when none is left."""
    if isinstance(dim, int):
        return dim
    return parse(dim).substitute(bindings).to_dim()


def size_hint(dim: Dim) -> int:
    """A size to count with where symbols are unknown: the value with every symbol 1, at least 1."""
    if isinstance(dim, int):
        return dim
    e = parse(dim)
    try:
        return max(1, e.evaluate({s: 1 for s in e.symbols()}))
    except ZeroDivisionError:
        return 1
