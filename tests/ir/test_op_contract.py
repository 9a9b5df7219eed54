"""The op contract: one kernel function per op, shared by the interpreter and
compiled modules; attributes computed once and passed as keywords; families as table rows.
The rows' numerics against onnxruntime are in test_ops_elementwise.py (cases per op and dtype)."""

from __future__ import annotations

import ast
from functools import lru_cache

import numpy as np
import pytest

from cuvil_edge.device_targets import codegen
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node
from cuvil_edge.ir.ops._contract import OpDef, free_names, source_of

CONTRACT_OPS = sorted(name for name, op in ops.registry().items() if isinstance(op, OpDef))


def test_the_unary_family_is_declared_as_rows():
    assert {"Abs", "Neg", "Reciprocal", "Elu", "Selu", "Mish", "IsNaN", "IsInf"} <= set(CONTRACT_OPS)


@pytest.mark.parametrize("op_type", CONTRACT_OPS)
def test_a_kernel_reads_only_numpy_and_its_listed_helpers(op_type):
    """What a compiled module pastes must be all the kernel needs: no hidden module globals."""
    op = ops.registry()[op_type]
    listed = {h.__name__ for h in op.helpers}
    for function in (*op.helpers, op.fn):
        assert free_names(function) <= listed, (function.__name__, free_names(function) - listed)


@lru_cache(maxsize=None)
def pasted_functions() -> dict[str, str]:
    """``ast.dump`` of every function a compiled module pastes, by name (parsed once: the text is
    that of every op's kernels, the same for each op's test)."""
    pasted = "\n\n".join(text for _, text in codegen.template_functions())  # shared kernels are pasted once
    return {f.name: ast.dump(f) for f in ast.parse(pasted).body if isinstance(f, ast.FunctionDef)}


@pytest.mark.parametrize("op_type", CONTRACT_OPS)
def test_compiled_modules_run_the_kernel_functions_own_source(op_type):
    op = ops.registry()[op_type]
    functions = pasted_functions()
    for function in (*op.helpers, op.fn):
        assert functions[function.__name__] == ast.dump(ast.parse(source_of(function)).body[0])


def test_emitted_calls_name_their_attributes():
    elu = ops.registry()["Elu"]
    node = Node("act", "Elu", ("x",), ("y",), {"alpha": 0.5}, 6)
    assert elu.emit(node, ["v0"], ["v1"]) == "v1 = k_elu(v0, alpha=0.5)"
    assert elu.kernel(node, np.array([-1.0, 2.0], np.float32))[0].tolist() == pytest.approx([0.5 * (np.exp(-1) - 1), 2])
    isinf = ops.registry()["IsInf"]
    node = Node("inf", "IsInf", ("x",), ("y",), {"detect_negative": 0}, 20)
    assert isinf.emit(node, ["v0"], ["v1"]) == "v1 = k_isinf(v0, detect_negative=0, detect_positive=1)"


def test_a_kernel_is_an_ordinary_importable_function():
    from cuvil_edge.ir.ops.activation import k_softplus

    x = np.array([-1000.0, 0.0, 1000.0], np.float32)
    np.testing.assert_allclose(k_softplus(x), [0.0, np.log(2.0), 1000.0])  # no overflow at the ends


def _registry_with(monkeypatch, fake):
    """The registry as it loads with ``fake`` as one more public module of the package."""
    real_import = ops.importlib.import_module
    names = [info for info in ops.pkgutil.iter_modules(ops.__path__)]

    def iter_modules(path):
        return [*names, type(names[0])(names[0].module_finder, "fake", False)]

    monkeypatch.setattr(ops.pkgutil, "iter_modules", iter_modules)
    monkeypatch.setattr(ops.importlib, "import_module",
                        lambda name: fake if name.endswith(".fake") else real_import(name))
    ops.registry.cache_clear()
    try:
        return ops.registry()
    finally:
        ops.registry.cache_clear()


def test_an_op_defined_twice_is_refused(monkeypatch):
    import types

    from cuvil_edge.ir.ops import unary

    fake = types.ModuleType("cuvil_edge.ir.ops.fake")
    fake.OPS = (unary.OPS[0],)
    with pytest.raises(ImportError, match=f"{unary.OPS[0].OP_TYPE} is defined twice"):
        _registry_with(monkeypatch, fake)


def test_a_module_in_the_old_style_is_refused(monkeypatch):
    import types

    fake = types.ModuleType("cuvil_edge.ir.ops.fake")  # a kernel plus a TEMPLATE string: two definitions
    fake.OP_TYPE, fake.VERSIONS, fake.TEMPLATE = "Fake", (1,), "def k_fake(x):\n    return x\n"
    fake.kernel = fake.infer = fake.flops = fake.emit = lambda *a: None
    with pytest.raises(ImportError, match="fake must list its ops as OpDef rows in OPS"):
        _registry_with(monkeypatch, fake)


HIDDEN_SCALE = 2.0


def _reads_a_module_global(x):
    return x * HIDDEN_SCALE + np.abs(x)


def test_the_check_finds_a_hidden_module_global():
    assert free_names(_reads_a_module_global) == {"HIDDEN_SCALE"}
