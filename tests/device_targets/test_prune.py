"""AST pruner: constant folding, dead branches, unused functions, idempotence, semantics."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from cuvil_edge.device_targets.prune import prune
from cuvil_edge.errors import BuildError

CONSTS = {"TARGET_SIMD_BITS": 128, "TARGET_HAS_FP16": False, "TARGET_ARCH": "aarch64", "TARGET_NAME": "rpi4"}


def body_of_run(expr: str) -> str:
    """Prune ``def run(): return <expr>`` and give back the returned expression."""
    out = prune(f"def run():\n    return {expr}\n", CONSTS)
    return out.strip().splitlines()[-1].strip().removeprefix("return ")


@pytest.mark.parametrize("expr, folded", [
    ("TARGET_SIMD_BITS", "128"),
    ("not TARGET_HAS_FP16", "True"),
    ("-TARGET_SIMD_BITS", "-128"),
    ("TARGET_SIMD_BITS // 32", "4"),
    ("TARGET_SIMD_BITS * 2 + 1", "257"),
    ("TARGET_SIMD_BITS >= 256", "False"),
    ("64 < TARGET_SIMD_BITS <= 128", "True"),
    ("TARGET_ARCH == 'aarch64'", "True"),
    ("TARGET_ARCH in ('x86_64', 'npu')", "False"),
    ("TARGET_ARCH not in ['x86_64']", "True"),
    ("TARGET_HAS_FP16 and x", "False"),
    ("TARGET_HAS_FP16 or x", "x"),
    ("not TARGET_HAS_FP16 and x", "x"),
    ("x and TARGET_HAS_FP16 and y", "x and False"),
    ("x or not TARGET_HAS_FP16 or y", "x or True"),
    ("x and True", "x and True"),  # value semantics: not just truthiness
    ("'fast' if TARGET_SIMD_BITS > 64 else 'slow'", "'fast'"),
    ("TARGET_NAME + '-build'", "'rpi4-build'"),
    ("x + TARGET_SIMD_BITS", "x + 128"),
    ("TARGET_SIMD_BITS / 0", "128 / 0"),  # left to raise at run time
    ("TARGET_SIMD_BITS ** 1000", "128 ** 1000"),  # no huge literals
    ("'ab' * TARGET_SIMD_BITS * 100", "'ab' * 128 * 100"),
])
def test_constant_folding(expr, folded):
    assert body_of_run(expr) == folded


IF_CASES = {
    "live then-branch": ("""
        def run(x):
            if TARGET_SIMD_BITS >= 128:
                return x + 1
            return x
        """, "return x + 1", "return x\n"),
    "dead then-branch, else kept": ("""
        def run(x):
            if TARGET_HAS_FP16:
                y = x.astype(np.float16)
            else:
                y = x
            return y
        """, "y = x", "float16"),
    "elif chain": ("""
        def run(x):
            if TARGET_ARCH == 'x86_64':
                return 'avx'
            elif TARGET_ARCH == 'aarch64':
                return 'neon'
            else:
                return 'scalar'
        """, "'neon'", "avx"),
    "emptied body gets pass": ("""
        def run(x):
            if TARGET_HAS_FP16:
                x = x + 1
        """, "pass", "x + 1"),
    "non-constant test kept": ("""
        def run(x):
            if x > TARGET_SIMD_BITS:
                return 1
            return 2
        """, "if x > 128:", "TARGET_"),
    "while False removed": ("""
        def run(x):
            while TARGET_HAS_FP16:
                x = x - 1
            return x
        """, "return x", "while"),
}


@pytest.mark.parametrize("case", sorted(IF_CASES))
def test_dead_branch_removal(case):
    source, present, absent = IF_CASES[case]
    out = prune(textwrap.dedent(source), CONSTS)
    assert present in out
    assert absent not in out


MODULE = textwrap.dedent('''\
    # generated header
    import numpy as np
    TARGET_SIMD_BITS = 256
    TARGET_HAS_FP16 = False
    TARGET_ARCH = 'x86_64'
    TARGET_NAME = 'reference'
    INFO = (TARGET_NAME, TARGET_SIMD_BITS)


    def k_wide(x):
        return x * 2


    def k_narrow(x):
        # a helper reached only through k_simd's live branch
        return _halve(x * 2) * 2


    def _halve(x):
        return x / 2


    def k_simd(x):
        if TARGET_SIMD_BITS >= 256:
            return k_wide(x)
        return k_narrow(x)


    def k_fp16(x):
        if TARGET_HAS_FP16:
            return x.astype(np.float16)
        return x


    def k_unused(x):
        return k_wide(x)


    def run(W, feeds):
        x = feeds['x']
        y = k_simd(x)
        if TARGET_HAS_FP16:
            y = k_fp16(y)
        return {'y': y + W['b']}
    ''')


def test_unused_functions_removed_transitively():
    out = prune(MODULE, CONSTS)
    assert "def k_narrow" in out and "def _halve" in out  # reached via the live branch
    for gone in ("def k_wide", "def k_unused", "def k_fp16"):
        assert gone not in out
    assert "TARGET_" not in out
    assert "INFO = ('rpi4', 128)" in out
    assert "# a helper reached only" in out  # untouched functions keep their comments
    assert out.startswith("# generated header\n")


def test_other_constants_keep_other_functions():
    out = prune(MODULE, {**CONSTS, "TARGET_SIMD_BITS": 512})
    assert "def k_wide" in out and "def k_narrow" not in out and "def _halve" not in out


@pytest.mark.parametrize("simd, fp16", [(128, False), (512, False), (128, True)])
def test_prune_is_idempotent(simd, fp16):
    consts = {**CONSTS, "TARGET_SIMD_BITS": simd, "TARGET_HAS_FP16": fp16}
    once = prune(MODULE, consts)
    assert prune(once, consts) == once


@pytest.mark.parametrize("simd, fp16", [(128, False), (512, False), (128, True), (256, True)])
def test_prune_preserves_semantics(simd, fp16):
    import numpy as np

    consts = {**CONSTS, "TARGET_SIMD_BITS": simd, "TARGET_HAS_FP16": fp16}
    # the reference: the unpruned module with the target's constants assigned
    assign = "".join(f"{k} = {v!r}\n" for k, v in consts.items())
    original: dict = {}
    exec(compile(MODULE.replace("INFO =", assign + "INFO ="), "<original>", "exec"), original)
    pruned: dict = {}
    exec(compile(prune(MODULE, consts), "<pruned>", "exec"), pruned)
    feeds, weights = {"x": np.arange(6, dtype=np.float32)}, {"b": np.float32(0.5)}
    want, got = original["run"](weights, feeds)["y"], pruned["run"](weights, feeds)["y"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert original["INFO"] == pruned["INFO"]


@pytest.mark.parametrize("source, match", [
    ("def run():\n    TARGET_SIMD_BITS = 1\n", "assigns"),
    ("def run(TARGET_SIMD_BITS):\n    return 1\n", "shadows"),
    ("def run(:\n", "does not parse"),
])
def test_bad_source_is_a_build_error(source, match):
    with pytest.raises(BuildError, match=match):
        prune(source, CONSTS)


# --- module-wide folds, once the constants are in (device_targets/fold_calls.py) -------------------
_HELPERS = '''
import numpy as np


def _out():
    out = []
    for i in range(2):
        out.append((8, 8)[i] // 2)
    return tuple(out)


def _spin():
    total = 0
    for i in range(10 ** 9):
        total += i
    return total


def _reads_numpy():
    return np.float32(1).itemsize


def _path(native):
    if native:
        return "native"
    return "blocks" if TARGET_BIG else "whole"


def _maybe(native):
    if native:
        return "native"


def run(W, feeds):
    x = feeds["x"]
    native = x.flags.writeable
    out = _out()
    spun = _spin()
    item = _reads_numpy()
    path = _path(native)
    maybe = _maybe(native)
    if path == "blocks":
        y = "blocks branch"
    elif path == "native":
        y = "native branch"
    else:
        y = "whole branch"
    if maybe == "other":
        y = "fall-off branch"
    if native and TARGET_BIG:
        y = "and-literal branch"
    if x.sum() and not TARGET_BIG:
        y = "call kept"
    return {"y": (y, out, spun, item)}
'''


def test_module_folds_decide_what_the_constants_make_certain():
    source = prune(_HELPERS, {"TARGET_BIG": False})
    body = source[source.index("def run("):]
    assert "(4, 4)" in body and "_out()" not in body and "def _out" not in source  # pure, of literals: evaluated
    assert "_spin()" in body  # past the line budget: left to run time
    assert "_reads_numpy()" in body  # reads a global: never evaluated at build time
    assert "blocks branch" not in body and "native branch" in body and "whole branch" in body
    assert "fall-off branch" in body  # _maybe can return None: nothing is known of its value
    assert "and-literal branch" not in body  # `native and False` is false whatever native holds
    assert "x.sum()" in body  # a call decided by a literal after it still runs


def test_module_folds_keep_the_module_s_behaviour():
    pruned = prune(_HELPERS.replace("10 ** 9", "10"), {"TARGET_BIG": False})
    namespace: dict = {}
    exec(pruned, namespace)  # noqa: S102 - the pruned module, run as the build runs it
    original: dict = {"TARGET_BIG": False}
    exec(_HELPERS.replace("10 ** 9", "10"), original)  # noqa: S102 - the same module unpruned
    x = np.ones(3)
    assert namespace["run"]({}, {"x": x}) == original["run"]({}, {"x": x})
