"""ONNX's own node test cases (``onnx.backend.test.case.node``) through our ONNX backend.

Every case whose model uses only ops of the edge op set (:data:`EDGE_OPS`) runs in both
backend modes (interpreter, compiled x86-64 module) and must match the case's expected
outputs with ONNX's tolerances and the exact dtype.  Cases that fail are listed with a
reason in ``excluded.yaml`` and run as ``xfail(strict=True)``, so one that starts
passing fails the suite until its exclusion is removed.

Run as a script to count passes (ours per mode, and onnxruntime's) for COUNTS.md::

    .venv/bin/python tests/conformance/test_conformance_node.py
"""

from __future__ import annotations

import sys
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from cuvil_edge.errors import CuvilError  # noqa: E402
from cuvil_edge.device_targets.onnx_backend import CuvilBackend  # noqa: E402

HERE = Path(__file__).parent
MODES = ("interpreter", "compiled")

#: The edge op set the project started from (62 ops).
EDGE_OPS = frozenset("""
    Conv ConvTranspose BatchNormalization Relu LeakyRelu Sigmoid Tanh HardSigmoid HardSwish Clip
    Add Sub Mul Div Sum MatMul Gemm MaxPool AveragePool GlobalAveragePool GlobalMaxPool
    Flatten Reshape Transpose Concat Split Squeeze Unsqueeze Softmax LogSoftmax Gather Slice Pad
    Resize ReduceMean ReduceSum ReduceMax Exp Log Sqrt Pow Erf Gelu LayerNormalization Dropout
    Identity Constant ConstantOfShape Shape Cast Expand Where Equal Less Greater Not
    QuantizeLinear DequantizeLinear QLinearConv QLinearMatMul MatMulInteger ConvInteger
""".split()) | frozenset("""
    Abs Neg Reciprocal Floor Ceil Round Sign Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh
    Softplus Softsign Elu Selu Celu ThresholdedRelu Shrink Mish IsNaN IsInf
    Min Max Mean Mod And Or Xor BitwiseAnd BitwiseOr BitwiseXor BitwiseNot BitShift PRelu
    ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceSumSquare ReduceLogSum ReduceLogSumExp
    InstanceNormalization GroupNormalization LRN ArgMax ArgMin CumSum Trilu Size CastLike DepthToSpace SpaceToDepth
    GatherElements GatherND ScatterElements ScatterND OneHot Tile Range TopK Hardmax Upsample Einsum
""".split()) | frozenset("""
    RMSNormalization LpNormalization MeanVarianceNormalization Attention RotaryEmbedding
    NonZero Compress Unique ReverseSequence EyeLike CenterCropPad
    HannWindow HammingWindow BlackmanWindow MelWeightMatrix DFT STFT
    NegativeLogLikelihoodLoss SoftmaxCrossEntropyLoss GridSample AffineGrid LpPool Col2Im MaxUnpool
    GreaterOrEqual LessOrEqual Det CumProd TensorScatter Scatter BitCast DynamicQuantizeLinear Swish
    NonMaxSuppression RNN GRU LSTM LinearAttention CausalConvWithState DeformConv SwiGLU RoiAlign
    TfIdfVectorizer
""".split())  # growing towards every default-domain op ONNX's node suite covers

RTOL, ATOL = 1e-3, 1e-7


def model_ops(graph) -> set[tuple[str, str]]:
    """(domain, op type) of every node, subgraphs included."""
    found = set()
    for node in graph.node:
        found.add((node.domain, node.op_type))
        for attr in node.attribute:
            for sub in [attr.g] * attr.HasField("g") + list(attr.graphs):
                found |= model_ops(sub)
    return found


def in_edge_set(model) -> bool:
    return all(domain in ("", "ai.onnx") and op in EDGE_OPS for domain, op in model_ops(model.graph))


@lru_cache(maxsize=1)
def node_cases() -> dict[str, object]:
    """Selected node test cases by name (ONNX builds them in memory; takes a few seconds)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return {c.name: c for c in sorted(cases, key=lambda c: c.name) if in_edge_set(c.model)}


def load_exclusions() -> dict[str, str]:
    """``excluded.yaml``: ``case name: reason`` (both modes) or ``case name-compiled: reason`` (one mode);
    model suites use ``model:<suite>/<model dir>``."""
    import yaml

    data = yaml.safe_load((HERE / "excluded.yaml").read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()):
        raise ValueError("excluded.yaml must map case names to non-empty reason strings")
    return data


def assert_outputs_match(expected, actual, rtol: float = RTOL, atol: float = ATOL) -> None:
    """ONNX's runner comparison, plus exact dtype and shape equality."""
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for i, (ref, out) in enumerate(zip(expected, actual)):
        ref, out = np.asarray(ref), np.asarray(out)
        assert out.dtype == ref.dtype, f"output {i}: dtype {out.dtype}, expected {ref.dtype}"
        assert out.shape == ref.shape, f"output {i}: shape {out.shape}, expected {ref.shape}"
        if ref.dtype == object or ref.dtype.kind in "SU":
            np.testing.assert_array_equal(out, ref)
        else:
            np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"output {i}")


def tolerances(case) -> tuple[float, float]:
    return getattr(case, "rtol", None) or RTOL, getattr(case, "atol", None) or ATOL


def run_ours(model, inputs, mode: str, cache_dir) -> tuple:
    rep = CuvilBackend.prepare(model, "CPU", mode=mode, cache_dir=cache_dir)
    return rep.run(inputs)


def run_ort(model, inputs) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))


def as_array(value) -> np.ndarray:
    """Case data as numpy: ONNX stores some tensors (float8, bfloat16 ...) as TensorProto, scalars as numpy scalars."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return np.asarray(value) if isinstance(value, (np.generic, int, float, bool)) else value


def check_case(case, runner) -> None:
    """Run every data set of ``case`` through ``runner(model, inputs)`` and compare."""
    rtol, atol = tolerances(case)
    for inputs, expected in case.data_sets:
        inputs = [as_array(v) for v in inputs]
        assert_outputs_match([as_array(v) for v in expected], runner(case.model, inputs), rtol, atol)


# --- the tests --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory):
    """Compiled modules cached by model digest for the whole session."""
    return tmp_path_factory.mktemp("cuvil-conformance-build")


def _params():
    excluded = load_exclusions()
    params = []
    for name in node_cases():
        for mode in MODES:
            reason = excluded.get(f"{name}-{mode}") or excluded.get(name)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(name, mode, id=f"{name}-{mode}", marks=marks))
    return params


@pytest.mark.parametrize("name,mode", _params())
def test_node_case(name, mode, build_cache):
    # prepare
    case = node_cases()[name]
    # act / assert
    check_case(case, lambda model, inputs: run_ours(model, inputs, mode, build_cache))


def test_exclusions_name_selected_cases():
    known = set(node_cases()) | {f"{n}-{m}" for n in node_cases() for m in MODES} | set(_model_names())
    unknown = sorted(set(load_exclusions()) - known)
    assert not unknown, f"excluded.yaml names cases that are not selected: {unknown}"


def _model_names() -> list[str]:
    try:
        from test_conformance_models import model_dirs
    except ImportError:
        return []
    return [f"model:{key}" for key in model_dirs()]


# --- counting (python tests/conformance/test_conformance_node.py) ------------------------


def _passes(case, runner) -> tuple[bool, str]:
    try:
        check_case(case, runner)
        return True, ""
    except CuvilError as e:
        return False, f"{type(e).__name__}: {str(e)[:160]}"
    except AssertionError as e:
        return False, "mismatch: " + " ".join(str(e).split())[:160]
    except Exception as e:  # onnxruntime's load/run failures and anything unexpected
        return False, f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"


def count(verbose: bool = False) -> dict[str, dict[str, int]]:
    """Pass counts per suite (node cases plain and expanded, model suites): selected, ours in
    each mode, onnxruntime. ``verbose`` prints one line per case."""
    import tempfile
    from types import SimpleNamespace

    from test_conformance_models import data_sets, model_dirs

    cache = tempfile.mkdtemp(prefix="cuvil-count-")
    runners = {
        "interpreter": lambda m, i: run_ours(m, i, "interpreter", cache),
        "compiled": lambda m, i: run_ours(m, i, "compiled", cache),
        "onnxruntime": run_ort,
    }
    suites = {"node cases, plain": {}, "node cases, expanded (function bodies)": {}, "model suites": {}}
    for name, case in node_cases().items():
        suites["node cases, expanded (function bodies)" if "_expanded" in name else "node cases, plain"][name] = case
    for key, folder in model_dirs().items():
        suites["model suites"][key] = SimpleNamespace(model=onnx.load(str(folder / "model.onnx")),
                                                      data_sets=data_sets(folder))
    totals = {}
    for suite, cases in suites.items():
        row = {"selected": len(cases), **{key: 0 for key in runners}}
        for name, case in cases.items():
            line = []
            for key, runner in runners.items():
                ok, why = _passes(case, runner)
                row[key] += ok
                line.append(f"{key}={'ok' if ok else why}")
            if verbose:
                print(name, " | ".join(line), flush=True)
        totals[suite] = row
    return totals


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    for suite, row in count(verbose="-v" in sys.argv).items():
        print(f"| {suite} | {row['selected']} | {row['interpreter']} | {row['compiled']} | {row['onnxruntime']} |")
