"""What a generated module holds that never runs: the digits CNN's x86-64 module is run under a line
tracer with the native kernels loaded and again with them off (the numpy fallbacks), on a batch of
two. Every executable line that neither run reaches must be declared a fallback by the kernel it
came from (``device_targets/fallbacks.py``: a ``# fallback: <why>`` comment the build turns into a
marker), and the module may hold only :data:`FALLBACKS` markers: no count of unrun lines is
tolerated, so a dead line the build stops removing, or a new one, fails here.

Measured: 14 of 154 executable lines never run, all declared, by 8 markers: the two typed
``MemoryError`` guards of native allocations (1 line each), softmax's empty-input guard (1), the
bias epilogue only outputs of 32k elements take, a batch of 16 here (1, and the 6 of
``_native_epilogue_1``, which only it calls), and both exits of each of the two ``_win_padded``
copies (4: the exit a site takes follows from the input's dims, which helper copies are not
given). The im2col-blocks path, decided by the input's itemsize, is gone since kernel copies are
specialised for their inputs' element types (the graph's, float32 only where the build computes
in it). Before fallbacks were declared this test allowed a count: helpers specialised per call
site took it from 80 of 349 lines to 49 of 223, the graph's static dims and literal locals to 44
of 209, the pure helpers of literals, conv_path's impossible paths and branch-test truth to 24 of
175; then loops of literal arithmetic (``p *= size`` over ``(8, 8)``), helper parameters every call passes alike now fold too."""

from __future__ import annotations

import ast
import sys
import textwrap

import numpy as np

from cuvil_edge.device_targets import build
from cuvil_edge.device_targets.fallbacks import declared_lines, fallbacks
from cuvil_edge.device_targets.prune import prune
from cuvil_edge.frontend import demo_model, load_model
from cuvil_edge.ir.ops import _native
from cuvil_edge.passes import optimize

#: the fallback markers the digits module holds (measured: 8, listed in this module's docstring)
FALLBACKS = 8


class _Payload:
    def __init__(self, graph):
        self.graph, self.payload_digest = graph, "c0" * 32


def _executable(source: str) -> set[int]:
    """The lines of the statements of the module's functions, less the constant expressions
    (docstrings and fallback markers: no code but a ``NOP`` a tracer may see)."""
    lines = set()
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef):
            for stmt in ast.walk(function):
                constant = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                if isinstance(stmt, ast.stmt) and stmt is not function and not constant:
                    lines.add(stmt.lineno)
    return lines


def _reached(code, weights, feeds) -> set[int]:
    """The lines of ``code`` (compiled as ``<generated>``) that ``run(weights, feeds)`` reaches."""
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the module the build wrote, run as the build runs it
    reached: set[int] = set()

    def trace(frame, event, arg):
        if frame.f_code.co_filename != "<generated>":
            return None
        if event == "line":
            reached.add(frame.f_lineno)
        return trace

    previous = sys.gettrace()  # a debugger's or coverage's, put back after
    sys.settrace(trace)
    try:
        namespace["run"](weights, feeds)
    finally:
        sys.settrace(previous)
    return reached


def _undeclared(source: str, reached: set[int]) -> list[int]:
    """The executable lines of ``source`` that nothing reached and no fallback declares."""
    markers = {f.line for f in fallbacks(source)}
    assert reached <= _executable(source) | markers | {0}  # the tracer saw this module's lines
    return sorted(_executable(source) - reached - declared_lines(source).keys())


def _shown(source: str, numbers: list[int]) -> str:
    lines = source.splitlines()
    return "\n".join(f"{n}: {lines[n - 1].strip()[:100]}" for n in numbers)


def test_every_line_the_digits_module_never_runs_is_a_declared_fallback(tmp_path, monkeypatch):
    graph, _ = optimize(load_model(demo_model.digits_cnn_onnx()))
    source = build(_Payload(graph), "x86-64", cache_dir=tmp_path).source
    code = compile(source, "<generated>", "exec")
    feeds = {graph.inputs[0].name: np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)}
    reached: set[int] = set()
    for native in ("1", "0"):
        monkeypatch.setenv("CUVIL_EDGE_NATIVE", native)
        monkeypatch.setattr(_native, "_state", {})  # the library is loaded (or not) again under this setting
        reached |= _reached(code, dict(graph.initializers), feeds)
    undeclared = _undeclared(source, reached)
    assert not undeclared, f"lines never run that no fallback declares:\n{_shown(source, undeclared)}"
    declared = fallbacks(source)
    shown = "\n".join(f"{f.line}: {f.reason}" for f in declared)
    assert len(declared) == FALLBACKS, f"{len(declared)} fallbacks declared (pinned: {FALLBACKS}):\n{shown}"


_MODULE = """
import numpy as np


def _rare(x):
    return x * 2


def run(W, feeds):
    x = feeds["x"]
    if x.size == 0:  # fallback: an empty input has nothing to scale
        return {"y": x.copy()}
    if x.ndim > 8:{comment}
        return {"y": _rare(x)}
    return {"y": x}
"""


def test_a_line_that_never_runs_and_no_fallback_declares_is_reported():
    feeds = {"x": np.ones(3)}
    source = prune(_MODULE.replace("{comment}", ""), {})
    undeclared = _undeclared(source, _reached(compile(source, "<generated>", "exec"), {}, feeds))
    lines = source.splitlines()
    assert [lines[n - 1].strip() for n in undeclared] == ["return x * 2", "return {'y': _rare(x)}"]
    declared = prune(_MODULE.replace("{comment}", "  # fallback: inputs of nine dims or more"), {})
    assert not _undeclared(declared, _reached(compile(declared, "<generated>", "exec"), {}, feeds))
    assert [f.reason for f in fallbacks(declared)] == [
        "an empty input has nothing to scale",
        "inputs of nine dims or more",
    ]


def test_the_checker_reads_a_hand_written_module():
    source = textwrap.dedent("""
        def run(W, feeds):
            if feeds:
                'fallback: a declared branch'
                return 1
            if W:
                return 2
            return 3
        """)
    assert _undeclared(source, _reached(compile(source, "<generated>", "exec"), {}, {})) == [7]


def test_kernel_copies_fold_element_types_only_where_the_build_computes_in_them():
    """A float16 build casts float32 inputs to float16 at run time, so its kernel copies must keep
    the branches that depend on a float32 input's type; an fp32 build folds them (the im2col
    block-size test reads the input's itemsize)."""
    from cuvil_edge.device_targets.codegen import generate_source
    from cuvil_edge.device_targets.spec import load_target

    graph, _ = optimize(load_model(demo_model.digits_cnn_onnx()))
    constants = load_target("x86-64").capabilities()
    fp32 = prune(generate_source(graph, compute_fp16=False), constants)
    fp16 = prune(generate_source(graph, compute_fp16=True), constants)
    unknown = prune(generate_source(graph), constants)
    assert "im2col_block_rows" not in fp32 and "float16" not in fp32
    assert "im2col_block_rows" in fp16 and fp16 == unknown
