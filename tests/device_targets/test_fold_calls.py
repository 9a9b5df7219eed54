"""Build-time folds of kernel copies and of the pruned module: each happens where the facts are
static, each leaves alone a case it cannot decide, and the folded code computes what the source
does."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from cuvil_edge.device_targets.prune import specialise_function


def _specialised(source: str, shapes: dict | None = None) -> str:
    return specialise_function(textwrap.dedent(source), "k_1", {}, present=list(shapes or ()), shapes=shapes)[0]


def _same_results(source: str, folded: str, *args) -> None:
    original: dict = {"np": np}
    exec(textwrap.dedent(source), original)  # noqa: S102 - the kernel as written
    copy: dict = {"np": np}
    exec(folded, copy)  # noqa: S102 - its folded copy
    assert repr(copy["k_1"](*args)) == repr(original["k"](*args))


# --- loops of literal arithmetic (fold_locals._loops) ----------------------------------------------
LOOPS = {
    "product over a literal tuple": (
        """
        def k(x):
            p = 1
            for size in (8, 8):
                p *= size
            return x * p
        """,
        ["x * 64"],
        ["for ", "p = 1"],
    ),
    "sum over a range, two accumulators": (
        """
        def k(x):
            q = 0
            last = -1
            for i in range(4):
                q = q + i * 2
                last = i
            return x + q + last
        """,
        ["x + 12 + 3"],
        ["for "],
    ),
    "the loop variable read after the loop": (
        """
        def k(x):
            for size in (2, 5):
                pass_through = size
            return x * size
        """,
        ["x * 5"],
        ["for "],
    ),
    "an empty literal loop does nothing": (
        """
        def k(x):
            p = 3
            for size in ():
                p *= size
            return x * p
        """,
        ["x * 3"],
        ["for "],
    ),
    "the static dims of a parameter": (
        """
        def k(x):
            right = 1
            for size in x.shape[1:]:
                right *= size
            return x.reshape(-1, right)
        """,
        ["x.reshape(-1, 12)"],
        ["for "],
    ),
}


@pytest.mark.parametrize("case", LOOPS, ids=list(LOOPS))
def test_loops_of_literal_arithmetic_are_run_at_build_time(case):
    source, present, absent = LOOPS[case]
    folded = _specialised(source, {"x": ("N", 3, 4)})
    assert all(p in folded for p in present), folded
    assert not any(a in folded for a in absent), folded
    _same_results(source, folded, np.arange(24.0).reshape(2, 3, 4))


KEPT_LOOPS = {
    "over a symbolic dim": """
        def k(x):
            p = 1
            for size in x.shape:
                p *= size
            return x.reshape(p)
        """,
    "a call in the body": """
        def k(x):
            p = 1
            for size in (2, 3):
                p *= abs_of(size)
            return x.reshape(p)
        """,
    "a break": """
        def k(x):
            p = 1
            for size in (2, 3):
                p *= size
                break
            return x.reshape(p)
        """,
    "an accumulator not known before the loop": """
        def k(x, p):
            for size in (2, 3):
                p *= size
            return x.reshape(p)
        """,
    "past the iteration budget": """
        def k(x):
            p = 0
            for size in range(10 ** 6):
                p += size
            return x.reshape(p)
        """,
    "inside a branch": """
        def k(x, flag):
            p = 1
            if flag:
                for size in (2, 3):
                    p *= size
            return x.reshape(p)
        """,
}


@pytest.mark.parametrize("case", KEPT_LOOPS, ids=list(KEPT_LOOPS))
def test_loops_that_are_not_literal_arithmetic_stay(case):
    assert "for size in" in _specialised(KEPT_LOOPS[case], {"x": ("N", 3, 4)})


def test_a_start_value_read_before_the_loop_stays():
    source = """
        def k(x):
            p = 2
            y = x * p
            for size in (3,):
                p *= size
            return y + p
        """
    folded = _specialised(source)
    assert "for " not in folded and "p = 2" in folded and "p = 6" in folded, folded
    _same_results(source, folded, np.ones(2))
