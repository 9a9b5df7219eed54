"""The model suites shipped in the onnx wheel (``onnx/backend/test/data``: pytorch-converted,
pytorch-operator, simple) through our ONNX backend, both modes, restricted to models whose
ops are all in the edge op set.  Exclusions live in ``excluded.yaml`` as ``model:<suite>/<dir>``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")

from onnx import numpy_helper  # noqa: E402

from test_conformance_node import MODES, assert_outputs_match, in_edge_set, load_exclusions, run_ours  # noqa: E402

SUITES = ("pytorch-converted", "pytorch-operator", "simple")


@lru_cache(maxsize=1)
def model_dirs() -> dict[str, Path]:
    """``suite/model`` -> folder, for the models whose ops are all in the edge set."""
    root = Path(onnx.__file__).parent / "backend" / "test" / "data"
    found = {}
    for suite in SUITES:
        for folder in sorted((root / suite).iterdir()):
            model_path = folder / "model.onnx"
            if model_path.is_file() and in_edge_set(onnx.load(str(model_path))):
                found[f"{suite}/{folder.name}"] = folder
    return found


def data_sets(folder: Path) -> list[tuple[list, list]]:
    """(inputs, expected outputs) per ``test_data_set_N``, in file order."""
    out = []
    for data_dir in sorted(folder.glob("test_data_set_*")):
        arrays = {}
        for kind in ("input", "output"):
            files = sorted(data_dir.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
            arrays[kind] = [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]
        out.append((arrays["input"], arrays["output"]))
    return out


def _params():
    excluded = load_exclusions()
    params = []
    for key in model_dirs():
        for mode in MODES:
            reason = excluded.get(f"model:{key}-{mode}") or excluded.get(f"model:{key}")
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(key, mode, id=f"{key}-{mode}", marks=marks))
    return params


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cuvil-conformance-models")


@pytest.mark.parametrize("key,mode", _params())
def test_model_suite(key, mode, build_cache):
    # prepare
    folder = model_dirs()[key]
    model = onnx.load(str(folder / "model.onnx"))
    # act / assert
    for inputs, expected in data_sets(folder):
        assert_outputs_match(expected, run_ours(model, inputs, mode, build_cache))


def test_some_models_selected():
    assert len(model_dirs()) > 10
