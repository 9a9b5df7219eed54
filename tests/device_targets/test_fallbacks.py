"""Declared fallbacks: ``# fallback: <why>`` comments become marker statements that go where their
branch goes, and a module's markers give back the lines they declare."""

from __future__ import annotations

import ast
import dis
import textwrap

import pytest

from cuvil_edge.device_targets.fallbacks import declared_lines, fallbacks
from cuvil_edge.device_targets.prune import prune
from cuvil_edge.device_targets.specialise import specialise_function
from cuvil_edge.errors import BuildError

KERNEL = '''
def k(x, mode):
    """Doubles x."""
    if x.size == 0:  # fallback: an empty input
        return x.copy()
    if mode == "a":
        y = x * 2
    else:  # fallback: another mode
        y = x * 3
    # fallback: the tail
    z = y + 1
    return z
'''


def _lines_of(source: str, reason: str) -> list[str]:
    lines = source.splitlines()
    (found,) = [f for f in fallbacks(source) if f.reason == reason]
    return [lines[n - 1].strip() for n in sorted(found.lines)]


def test_comments_become_markers_at_the_start_of_what_they_declare():
    source = prune(KERNEL, {}, roots=("k",))
    assert ast.get_docstring(ast.parse(source).body[0]) == "Doubles x."
    assert [f.reason for f in fallbacks(source)] == ["an empty input", "another mode", "the tail"]
    assert _lines_of(source, "an empty input") == ["return x.copy()"]
    assert _lines_of(source, "another mode") == ["y = x * 3"]
    assert _lines_of(source, "the tail") == ["z = y + 1", "return z"]
    assert prune(source, {}, roots=("k",)) == source  # idempotent: declared once


def test_a_kernel_copy_keeps_its_markers_and_its_docstring():
    text, _, _ = specialise_function(textwrap.dedent(KERNEL), "k_1", {"mode": "a"}, doc="k for mode a")
    assert ast.get_docstring(ast.parse(text).body[0]) == "k for mode a"
    assert [f.reason for f in fallbacks(text)] == ["an empty input", "the tail"]  # `else` folded away


def test_a_branch_that_always_runs_is_no_fallback():
    source = "def run(x):\n    if TARGET_X:  # fallback: rare\n        x = x + 1\n    return x\n"
    assert fallbacks(prune(source, {"TARGET_X": True})) == []  # spliced: the marker would declare `return x`
    assert fallbacks(prune(source, {"TARGET_X": False})) == []  # gone with its branch
    assert [f.reason for f in fallbacks(prune(source, {}))] == ["rare"]


def test_a_fallback_must_say_why():
    with pytest.raises(BuildError, match="must say why"):
        prune("def run(x):\n    if x:  # fallback:\n        return 1\n    return 2\n", {})


def test_a_function_only_declared_code_calls_is_declared_and_one_called_elsewhere_is_not():
    source = textwrap.dedent("""
        def _only_rare(x):
            return x + 1

        def _shared(x):
            return x - 1

        def run(x):
            if x.big and _only_rare(x):
                'fallback: big inputs'
                return _shared(x)
            return _shared(x)
        """)
    covered = declared_lines(source)
    lines = source.splitlines()
    assert sorted(lines[n - 1].strip() for n in covered) == ["return _shared(x)", "return x + 1"]
    assert "called only from declared fallbacks (_only_rare)" in covered.values()


def test_a_marker_runs_no_code():
    plain = "def f(x):\n    if x:\n        return 1\n    return 2\n"
    marked = "def f(x):\n    if x:\n        'fallback: rare'\n        return 1\n    return 2\n"
    code = {}
    for name, text in (("plain", plain), ("marked", marked)):
        namespace: dict = {}
        exec(compile(text, name, "exec"), namespace)  # noqa: S102 - two small functions
        code[name] = namespace["f"].__code__
    assert "fallback: rare" not in code["marked"].co_consts  # a NOP for its line, nothing loaded
    assert _opnames(code["marked"]) == _opnames(code["plain"])


def _opnames(code) -> list[str]:
    return [i.opname for i in dis.get_instructions(code) if i.opname != "NOP"]


def test_the_same_text_in_a_string_declares_nothing():
    source = 'def run(x):\n    if x:\n        return "# fallback: in a string"\n    return 2\n'
    assert fallbacks(prune(source, {})) == []
