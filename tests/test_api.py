"""The Python API (cuvil_edge.api): compile against onnxruntime, plan, simulate, the version, a lazy
import, and the README's example run as written."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import cuvil_edge
from cuvil_edge.cli import main as cli
from cuvil_edge.config import load_federation
from cuvil_edge.errors import (
    ConfigError, ExecutionError, MalformedModelError, ModelError, ModelFileError, UnknownTargetError,
)
from cuvil_edge.frontend.demo_model import digits_cnn_onnx

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FEDERATION = ROOT / "configs" / "federation.yaml"
DIGITS = digits_cnn_onnx()


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32)


def reference(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def two_in_two_out() -> bytes:
    """sum = a + b, prod = a * b over float32[batch, 3]."""
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3])  # noqa: E731
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"])]
    graph = helper.make_graph(nodes, "two", [vi("a"), vi("b")], [vi("sum"), vi("prod")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


SOURCES = {
    "path": lambda tmp: (tmp / "digits.onnx").write_bytes(DIGITS) and tmp / "digits.onnx",
    "str path": lambda tmp: (tmp / "digits.onnx").write_bytes(DIGITS) and str(tmp / "digits.onnx"),
    "bytes": lambda tmp: DIGITS,
    "ModelProto": lambda tmp: onnx.load_from_string(DIGITS),
}


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("target", ["x86-64", "ascend-310"])
def test_compile_matches_onnxruntime_from_every_kind_of_source(tmp_path, source, target):
    x = images(5)
    model = cuvil_edge.compile(SOURCES[source](tmp_path), target=target)
    got = model(x)
    assert isinstance(got, np.ndarray) and got.shape == (5, 10)
    np.testing.assert_allclose(got, reference(DIGITS, {"image": x})[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model({"image": x}), got)
    np.testing.assert_array_equal(model(image=x), got)
    assert (model.target, model.precision) == (target, "fp32")
    assert f"target {target}" in model.source and "def " in model.source
    assert model.inputs == {"image": ("float32", ["batch", 1, 8, 8])}
    assert model.memory_plan(64).peak_bytes > model.memory_plan(1).peak_bytes > 0  # static targets: chunks


@pytest.mark.parametrize("target, precision, atol", [("x86-64", "fp16", 1e-3), ("jetson-orin-nano", "fp16", 1e-2),
                                                     ("rpi4", "int8", 2e-2)])
def test_lower_precisions_stay_close_to_onnxruntime(target, precision, atol):
    x = images(16, seed=1)
    calibration = images(64, seed=2) if precision == "int8" else None
    model = cuvil_edge.compile(DIGITS, target=target, precision=precision, calibration=calibration)
    got = model(x)
    want = reference(DIGITS, {"image": x})[0]
    np.testing.assert_allclose(got, want, atol=atol)
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9
    assert model.precision == precision and precision in model.note
    if precision == "int8":
        assert "64 calibration samples" in model.note


def test_int8_calibration_by_input_name_or_npz_file_is_the_same_model(tmp_path):
    samples = images(40, seed=3)
    np.savez(tmp_path / "calib.npz", image=samples)
    x = images(3)
    by_array = cuvil_edge.compile(DIGITS, precision="int8", calibration=samples)(x)
    by_name = cuvil_edge.compile(DIGITS, precision="int8", calibration={"image": samples})(x)
    by_file = cuvil_edge.compile(DIGITS, precision="int8", calibration=tmp_path / "calib.npz")(x)
    np.testing.assert_array_equal(by_array, by_name)
    np.testing.assert_array_equal(by_array, by_file)


def test_a_model_with_two_inputs_and_two_outputs_takes_names_and_returns_a_dict():
    model = cuvil_edge.compile(two_in_two_out())
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 2, np.float32)
    got = model(a=a, b=b)
    assert set(got) == {"sum", "prod"}
    np.testing.assert_array_equal(got["sum"], a + b)
    np.testing.assert_array_equal(model({"a": a, "b": b})["prod"], a * b)
    with pytest.raises(ExecutionError, match="pass them by name"):
        model(a)


BAD_COMPILES = {
    "undecodable bytes": (dict(model=b"not a model"), MalformedModelError, "not an ONNX model"),
    "missing file": (dict(model="no/such/model.onnx"), ModelFileError, "does not exist"),
    "not a model at all": (dict(model=42), ModelError, "ONNX file path, serialized ONNX bytes or an onnx.ModelProto"),
    "unknown target": (dict(model=DIGITS, target="z80"), UnknownTargetError, "known targets: .*rpi4"),
    "target not a name": (dict(model=DIGITS, target=None), UnknownTargetError, "unknown device target"),
    "unknown precision": (dict(model=DIGITS, precision="fp8"), ConfigError, "fp32, fp16, int8"),
    "calibration for another input": (dict(model=DIGITS, precision="int8", calibration={"x": images(4)}),
                                      ConfigError, r"inputs are \['image'\]"),
    "calibration without samples": (dict(model=DIGITS, precision="int8",
                                         calibration=np.zeros((0, 1, 8, 8), np.float32)),
                                    ConfigError, "non-zero number of samples"),
    "calibration of another kind": (dict(model=DIGITS, precision="int8", calibration=[1, 2]), ConfigError,
                                    "an .npz path, an array"),
}


@pytest.mark.parametrize("case", list(BAD_COMPILES))
def test_bad_compile_arguments_raise_typed_errors(case):
    kwargs, error, message = BAD_COMPILES[case]
    with pytest.raises(error, match=message):
        cuvil_edge.compile(**kwargs)


@pytest.fixture(scope="module")
def digits_model():
    return cuvil_edge.compile(DIGITS)


BAD_CALLS = {
    "float64 array": (lambda m: m(images(2).astype(np.float64)), "must be float32, got float64; cast it"),
    "a list": (lambda m: m([[0.0] * 8] * 8), "must be a numpy array, got list"),
    "wrong rank": (lambda m: m(np.zeros((8, 8), np.float32)), r"must have shape \['batch', 1, 8, 8\]"),
    "wrong size": (lambda m: m(np.zeros((2, 1, 7, 8), np.float32)), "axis 2 must be 8, got 7"),
    "wrong name": (lambda m: m(pixels=images(1)), r"takes inputs \['image'\], got \['pixels'\]"),
    "two ways at once": (lambda m: m(images(1), image=images(1)), "pass the inputs one way"),
    "nothing": (lambda m: m(), r"takes inputs \['image'\], got \[\]"),
    "run without a dict": (lambda m: m.run(images(1)), "feeds must map input names to arrays"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_inputs_to_a_compiled_model_raise_execution_errors(digits_model, case):
    call, message = BAD_CALLS[case]
    with pytest.raises(ExecutionError, match=message):
        call(digits_model)


def test_plan_gives_one_plan_per_site_of_the_shipped_federation():
    plans = cuvil_edge.plan(FEDERATION)
    config = load_federation(FEDERATION)
    assert [p.site for p in plans] == [s.site for s in config.load_sites()]
    assert [p.target for p in plans] == [s.target for s in config.load_sites()]
    for p in plans:
        assert [o.precision for o in p.options] == ["fp32", "fp16"]  # no calibration file: int8 not offered
        assert p.chosen is not None and p.chosen.fits and p.reason
        assert all(o.package_bytes > 0 and o.peak_bytes > 0 and o.latency_ms > 0 for o in p.options)
    assert [p.site for p in cuvil_edge.plan(config)] == [p.site for p in plans]  # a loaded config works too


def test_plan_of_another_model_plans_that_model():
    shipped = cuvil_edge.plan(str(FEDERATION))
    narrow = cuvil_edge.plan(FEDERATION, model=digits_cnn_onnx(channels=8))
    assert all(n.options[0].package_bytes < s.options[0].package_bytes for n, s in zip(narrow, shipped))


def test_plan_of_a_missing_federation_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml"):
        cuvil_edge.plan(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="must be a path"):
        cuvil_edge.simulate(42)
    with pytest.raises(ConfigError, match="rounds must be a positive integer"):
        cuvil_edge.simulate(FEDERATION, rounds=0)


def test_version_is_the_distribution_version_and_the_command_prints_it(capsys):
    assert cuvil_edge.__version__ == importlib.metadata.version("cuvil-edge")
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"cuvil-edge {cuvil_edge.__version__}\n"


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert cuvil_edge._version() == pyproject["project"]["version"]


def test_importing_cuvil_edge_and_naming_its_api_loads_no_heavy_dependency():
    code = ("import sys, cuvil_edge; cuvil_edge.compile, cuvil_edge.plan, cuvil_edge.simulate, cuvil_edge.__version__; "
            "print(sorted(m for m in ('torch', 'flwr', 'onnx', 'opacus') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def readme_example() -> str:
    """The python block of the README's "Python API" section."""
    section = README.read_text(encoding="utf-8").split("## Python API", 1)[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section shows one python example"
    return blocks[0]


@pytest.mark.e2e
def test_readme_python_api_example_as_written_simulates_one_round(tmp_path, monkeypatch, capsys):
    """The README's example, run literally from a copy of the repository's configs: it compiles,
    plans, and simulates one round of the shipped demo federation in a fresh home (about 30 s)."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "users-flower-home"))
    monkeypatch.delenv("FLWR_LOG_LEVEL", raising=False)
    scope: dict = {}
    exec(compile(readme_example(), str(README), "exec"), scope)
    assert scope["probs"].shape == (2, 10)
    run = scope["run"]
    assert [r.round for r in run.rounds] == [0, 1] and run.final.round == 1 and run.stopped_early is None
    assert 0.0 <= run.final.global_accuracy <= 1.0
    assert set(run.final.sites) == {"hospital-a", "factory-b", "fleet-c"}
    for site in run.final.sites.values():
        assert site.status == "ok" and site.precision == "fp32", site
        assert 0 < site.eps_spent < 8.0 and site.eps_spent + site.eps_remaining == pytest.approx(8.0)
        assert site.package_bytes > 0 and site.stats["train-num-examples"] >= 0
    assert run.home == tmp_path / ".cuvil" and run.run_dir.parent == tmp_path / "runs"
    assert (run.run_dir / "metrics.json").is_file() and (run.run_dir / "flwr").is_dir()  # Flower's state: the run's
    assert not (tmp_path / "users-flower-home").exists() and "FLWR_LOG_LEVEL" not in os.environ
    printed = capsys.readouterr().out
    assert "hospital-a jetson-orin-nano fp32" in printed and "round 1: global test accuracy" in printed
