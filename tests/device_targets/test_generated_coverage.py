"""What a generated module holds that never runs: the digits CNN's x86-64 module is run under a line
tracer with the native kernels loaded and again with them off (the numpy fallbacks), on a batch of
two; every line of the module that neither run reaches is counted. The count may only go down.
Helpers specialised per call site took it from 80 of 349 lines to 49 of 223; folding in the graph's
static dims and the literal locals (``device_targets/fold_locals.py``) to 44 of 209; deciding, once
the target's constants are in, the pure helpers of literals, the paths ``conv_path`` cannot return
and the truth of branch tests (``device_targets/fold_calls.py``) to 24 of 175. What is left: the
im2col-blocks path (chosen from a size the module still computes), the bias epilogue (from 32k
outputs: a larger batch), and error and empty-input guards."""

from __future__ import annotations

import ast
import sys

import numpy as np

from cuvil_edge.device_targets import build
from cuvil_edge.frontend import demo_model, load_model
from cuvil_edge.ir.ops import _native
from cuvil_edge.passes import optimize

#: lines of the module that no run reaches, at most (measured: 24 of 175 executable lines)
NEVER_RUN = 24


class _Payload:
    def __init__(self, graph):
        self.graph, self.payload_digest = graph, "c0" * 32


def _executable(source: str) -> set[int]:
    lines = set()
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef):
            for stmt in ast.walk(function):
                docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                if isinstance(stmt, ast.stmt) and stmt is not function and not docstring:
                    lines.add(stmt.lineno)
    return lines


def _run_traced(code, graph, monkeypatch, native: str) -> set[int]:
    monkeypatch.setenv("CUVIL_EDGE_NATIVE", native)
    monkeypatch.setattr(_native, "_state", {})  # the library is loaded (or not) again under this setting
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the module the build wrote, run as the build runs it
    reached: set[int] = set()

    def trace(frame, event, arg):
        if frame.f_code.co_filename != "<generated>":
            return None
        if event == "line":
            reached.add(frame.f_lineno)
        return trace

    feeds = {graph.inputs[0].name: np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)}
    previous = sys.gettrace()  # a debugger's or coverage's, put back after
    sys.settrace(trace)
    try:
        namespace["run"](dict(graph.initializers), feeds)
    finally:
        sys.settrace(previous)
    return reached


def test_the_digits_module_holds_few_lines_that_never_run(tmp_path, monkeypatch):
    graph, _ = optimize(load_model(demo_model.digits_cnn_onnx()))
    source = build(_Payload(graph), "x86-64", cache_dir=tmp_path).source
    code = compile(source, "<generated>", "exec")
    reached = _run_traced(code, graph, monkeypatch, "1") | _run_traced(code, graph, monkeypatch, "0")
    executable = _executable(source)
    assert reached <= executable | {0}  # the tracer saw this module's lines
    never = sorted(executable - reached)
    lines = source.splitlines()
    shown = "\n".join(f"{n}: {lines[n - 1].strip()[:100]}" for n in never)
    assert len(never) <= NEVER_RUN, f"{len(never)} lines never run (at most {NEVER_RUN}):\n{shown}"
