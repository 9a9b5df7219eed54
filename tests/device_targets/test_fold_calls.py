"""Build-time folds of kernel copies and of the pruned module: each happens where the facts are
static, each leaves alone a case it cannot decide, and the folded code computes what the source
does."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from cuvil_edge.device_targets.prune import prune
from cuvil_edge.device_targets.specialise import specialise_function


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


# --- element types the graph makes known (fold_locals._Dtypes) -------------------------------------
DTYPED = """
def k(x, w):
    t = np.float32 if x.dtype == np.float16 else x.dtype
    xt = x.astype(t, copy=False)
    cols = 9 * xt.itemsize
    native = "native" if x.dtype == np.float32 else "numpy"
    fits = t == np.float32 and x.size > 3
    floating = x.dtype.kind == "f"
    other = w.dtype == np.float32
    u = np.float32
    classes = u == np.float32
    return cols, native, fits, floating, other, classes
"""


def _typed(dtype: str) -> str:
    return specialise_function(DTYPED, "k_1", {}, present=["x", "w"], dtypes={"x": dtype})[0]


def test_known_element_types_fold_their_comparisons_and_sizes():
    folded = _typed("float32")
    assert "cols" not in folded and "native =" not in folded and "floating" not in folded, folded
    assert "fits = x.size > 3" in folded and "(36, 'native', fits, True," in folded, folded
    x, w = np.ones(4, np.float32), np.ones(2, np.float64)
    _same_results(DTYPED, folded, x, w)
    halves = _typed("float16")
    assert "'numpy'" in halves, halves  # x.dtype == np.float32 is False for a float16 x
    _same_results(DTYPED, halves, x.astype(np.float16), w)


def test_unknown_element_types_and_class_comparisons_stay():
    folded = _typed("float32")
    assert "w.dtype == np.float32" in folded  # w's dtype is not given
    assert "u == np.float32" in folded  # two classes: numpy scalar types compared as classes
    untyped = specialise_function(DTYPED, "k_2", {}, present=["x", "w"])[0]
    assert "x.dtype == np.float16" in untyped and "xt.itemsize" in untyped
    halves = _typed("float16")
    assert "xt.itemsize" in halves  # t = np.float32 (a class) is not taken for a dtype alias


# --- parameters every call passes alike (fold_calls._bind_constant_arguments) -----------------------
BOUND = """
def _path(native, large, cols):
    if native:
        return "native"
    return "blocks" if not large or cols > 100 else "whole"


def _pad(x, out, fill=0):
    return x + out[0] + fill


def _view(x, out):
    return _pad(x, out)


def _two_sites(x, k):
    return x * k


def _rebinds(x, k):
    k = k + 1
    return x * k


def _passed(x, k):
    return x - k


def _apply(f, x):
    return f(x, 1)


def run(W, feeds):
    x = feeds["x"]
    path = _path(x.flags.writeable, TARGET_LARGE, 64)
    y = _view(x, (8, 8))
    z = _two_sites(x, 2) + _two_sites(x, 3)
    r = _rebinds(x, 1)
    q = _apply(_passed, x)
    if path == "blocks":
        y = y + 100
    return {"y": (path, y, z, r, q)}


def helper_root(x, k):
    return x * k
"""


def test_a_parameter_every_call_passes_alike_becomes_a_literal():
    pruned = prune(BOUND, {"TARGET_LARGE": True}, roots=("run", "helper_root"))
    assert "def _path(native):" in pruned and "_path(x.flags.writeable)" in pruned
    assert "y + 100" not in pruned  # _path can no longer return "blocks": the branch goes
    assert "def _pad(x):" in pruned and "return x + 8 + 0" in pruned  # through _view, and a default
    assert "def _view(x):" in pruned and "_view(x)" in pruned
    namespace: dict = {}
    exec(pruned, namespace)  # noqa: S102 - the pruned module
    original: dict = {"TARGET_LARGE": True}
    exec(BOUND, original)  # noqa: S102 - the same module unpruned
    x = np.ones(2)
    assert repr(namespace["run"]({}, {"x": x})) == repr(original["run"]({}, {"x": x}))


def test_parameters_calls_pass_differently_or_that_cannot_be_seen_stay():
    pruned = prune(BOUND, {"TARGET_LARGE": True}, roots=("run", "helper_root"))
    assert "def _two_sites(x, k):" in pruned  # 2 at one call, 3 at the other
    assert "def _rebinds(x, k):" in pruned  # the body stores k
    assert "def _passed(x, k):" in pruned  # passed as a value: not every call is in sight
    assert "def helper_root(x, k):" in pruned  # a root: called from outside the module
