"""Every model of the test export set through the whole path a site's model takes, not only the
ONNX backend: the coordinator imports and optimizes it, sets the site's precision, encodes the
payload and signs a package for the site; the agent verifies and accepts it (``verify_and_accept``
against its pinned root and anti-rollback state), widens stored weights once at load, builds it
for its target and runs it; the outputs match onnxruntime.

The whole path, because a model can pass ``cuvil-edge compile --report`` and still fail right after,
at packaging: initializer names made by the importer or a pass out of torch's path-like node and
value names (``/Reshape_const1``, ``/Constant_output_0``) are refused by the package.

Models: the architecture exports (``test_exports.EXPORTS``), the real architectures
(``test_architectures.ARCHITECTURES``), a CNN flattening with ``x.reshape(x.shape[0], -1)``, an
LSTM and a GRU (each exported with a symbolic batch), on every target in ``device_targets/specs``
at fp32; the small torch models also as an fp16 package built at fp16 on the targets that compute
in it, and as an int8 package (on x86-64); and the model suites shipped in the onnx wheel (what
``tests/conformance`` passes today), on every target too.

Tolerances: fp32 builds rtol 1e-4 / atol 1e-5 against onnxruntime (``test_exports``); the fp16 build
and the int8 package as ``tests/device_targets/test_target_build.py`` and
``tests/passes/test_quantize.py`` check theirs.
"""

from __future__ import annotations

import io
import sys
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented
import pytest
import torch
from torch import nn

import test_architectures as architectures
import test_exports as exports
from torch_models import randomise_batchnorm
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.coordinator.precision import with_precision
from cuvil_edge.device_targets import build
from cuvil_edge.device_targets.spec import list_targets, load_target
from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.frontend import load_model
from cuvil_edge.device_targets.onnx_backend import _shape_deciding_inputs
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir_serialize import AntiRollbackState, encode_payload, sign_release, verify_and_accept, write_package
from cuvil_edge.passes import optimize
from cuvil_edge.passes.quantize import dequantize_at_load

# the conformance suite's selection (which models, which pass today) is reused, not restated
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
import test_conformance_models as conformance  # noqa: E402
from test_conformance_node import ATOL as SUITE_ATOL, RTOL as SUITE_RTOL, load_exclusions  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
FP16_RTOL, FP16_ATOL = 5e-2, 5e-3  # test_target_build: a torch model built at fp16 on jetson
INT8_TOLERANCE = 0.05  # test_quantize: max |int8 - reference| relative to the output's range
BATCH = 2  # ascend-310 pads it to its static batch of 4
SITE = "site-a"
TARGETS = list_targets()
INT8_TARGET = "x86-64"  # int8 weights are widened to float at load: one target shows the package runs
MAX_PACKAGE_BYTES = 1 << 28


# --- the models ------------------------------------------------------------------------------------
class FlattenCNN(nn.Module):
    """``x.reshape(x.shape[0], -1)``: torch computes the shape from Shape(x) at run time."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.reshape(x.shape[0], -1))


class Recurrent(nn.Module):
    """An ``nn.LSTM`` or ``nn.GRU`` over a sequence (two layers), its last step through a Linear."""

    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.rnn, self.head = cell(6, 12, num_layers=2, batch_first=True), nn.Linear(12, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


@dataclass(frozen=True)
class Model:
    onnx: Callable[[], bytes]
    feeds: Callable[[int, np.random.Generator], dict[str, np.ndarray]]


def _torch_export(make: Callable[[], nn.Module], shape: tuple[int, ...]) -> Model:
    @lru_cache(maxsize=None)
    def data() -> bytes:
        torch.manual_seed(0)
        model = randomise_batchnorm(make()).eval()
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(2, *shape),), buffer, dynamo=False, opset_version=17,
                              input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
        return buffer.getvalue()

    return Model(data, lambda batch, rng: {"x": rng.standard_normal((batch, *shape)).astype(np.float32)})


SMALL = {
    "cnn_reshape_flatten": _torch_export(FlattenCNN, (3, 8, 8)),
    "lstm": _torch_export(lambda: Recurrent(nn.LSTM), (5, 6)),
    "gru": _torch_export(lambda: Recurrent(nn.GRU), (5, 6)),
}
MODELS = {
    **SMALL,
    **{f"arch_{name}": _torch_export(make, shape) for name, (make, shape) in architectures.ARCHITECTURES.items()},
    **{f"export_{name}": Model(lambda name=name: exports.exported(name), spec.feeds)
       for name, spec in exports.EXPORTS.items()},
}


def _conformance_models() -> list[str]:
    """The shipped model suites the conformance tests pass today (their exclusions left out)."""
    excluded = load_exclusions()
    return [key for key in conformance.model_dirs()
            if not any(excluded.get(f"model:{key}{mode}") for mode in ("", "-interpreter", "-compiled"))]


# --- the coordinator -------------------------------------------------------------------------------
class Coordinator:
    """The coordinator's home (keys, root.json) and what it made from each model, once per session."""

    def __init__(self, home: Path) -> None:
        private, _ = init_keys(home)
        self.keys = load_signing_keys(private)
        self.root_json = (home / "root.json").read_bytes()
        self._payloads: dict[tuple[str, str], tuple[bytes, object]] = {}

    @staticmethod
    @lru_cache(maxsize=None)
    def optimized(data: bytes) -> Graph:
        return optimize(load_model(data))[0]  # as `cuvil-edge compile` and the run launcher do

    def package(self, name: str, data: bytes, target: str, precision: str = "fp32") -> bytes:
        """``data`` as the coordinator packages it for a site on ``target`` at ``precision``."""
        if (name, precision) not in self._payloads:
            graph, _ = with_precision(self.optimized(data), precision)
            payload = encode_payload(graph)
            release = sign_release(payload, "model", 1, TARGETS, self.keys.release)
            self._payloads[name, precision] = payload, release
        payload, release = self._payloads[name, precision]
        now = int(time.time())
        return write_package(None, site=SITE, target=target, version=1, signing_key=self.keys.coordinator,
                             issued_at=now, expires=now + 600, release=release, payload=payload,
                             roots=self.keys.roots)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory) -> Coordinator:
    return Coordinator(tmp_path_factory.mktemp("coordinator-home"))


# --- the agent -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Loaded:
    graph: Graph
    payload_digest: str


def site_runs(coordinator: Coordinator, package: bytes, target: str, state_dir: Path, build_cache: Path,
              precision: str = "fp32"):
    """What an agent on ``target`` does with a delivered package (``agent.runtime``): verify and
    accept it, widen stored weights once at load, build it (cached by structure) for its target.
    Returns the verified package and the compiled model."""
    state = AntiRollbackState(state_dir)
    state.initialise(coordinator.root_json)
    verified = verify_and_accept(package, state, site=SITE, target=target, now=int(time.time()),
                                 max_package_bytes=MAX_PACKAGE_BYTES)
    model = build(_Loaded(dequantize_at_load(verified.graph), verified.payload_digest), target,
                  cache_dir=build_cache, precision=precision)
    return verified, model


@lru_cache(maxsize=None)
def _session(data: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _expected(data: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = _session(data)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.ptp(want), 1e-6))


# --- the tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_a_site_on_every_target_runs_what_onnxruntime_runs(name, target, coordinator, build_cache, tmp_path):
    # prepare
    data = MODELS[name].onnx()
    feeds = MODELS[name].feeds(BATCH, np.random.default_rng(1))
    # act
    _, model = site_runs(coordinator, coordinator.package(name, data, target), target, tmp_path / "state",
                         build_cache)
    got = model.run(feeds)
    # assert
    for output, want in _expected(data, feeds).items():
        assert got[output].shape == want.shape, f"{name} on {target}: {output}"
        np.testing.assert_allclose(got[output], want, rtol=RTOL, atol=ATOL, err_msg=f"{name} on {target}: {output}")


FP16_TARGETS = [t for t in TARGETS if load_target(t).fp16]  # where a site YAML may say `precision: fp16`


@pytest.mark.parametrize("target", FP16_TARGETS)
@pytest.mark.parametrize("name", list(SMALL))
def test_an_fp16_site_runs_its_fp16_package(name, target, coordinator, build_cache, tmp_path):
    data = MODELS[name].onnx()
    feeds = MODELS[name].feeds(BATCH, np.random.default_rng(2))
    package = coordinator.package(name, data, target, precision="fp16")
    verified, model = site_runs(coordinator, package, target, tmp_path / "state", build_cache, precision="fp16")
    assert np.dtype(np.float16) in {a.dtype for a in verified.graph.initializers.values()}
    got = model.run(feeds)
    for output, want in _expected(data, feeds).items():
        np.testing.assert_allclose(got[output], want, rtol=FP16_RTOL, atol=FP16_ATOL, err_msg=f"{name}: {output}")


@pytest.mark.parametrize("name", list(SMALL))
def test_an_int8_package_runs_close_to_onnxruntime(name, coordinator, build_cache, tmp_path):
    data = MODELS[name].onnx()
    feeds = MODELS[name].feeds(BATCH, np.random.default_rng(3))
    package = coordinator.package(name, data, INT8_TARGET, precision="int8")
    verified, model = site_runs(coordinator, package, INT8_TARGET, tmp_path / "state", build_cache)
    assert np.dtype(np.int8) in {a.dtype for a in verified.graph.initializers.values()}
    got = model.run(feeds)
    for output, want in _expected(data, feeds).items():
        assert _relative_error(got[output], want) < INT8_TOLERANCE, f"{name}: {output}"


def _bound(data: bytes, feeds: dict[str, np.ndarray]) -> tuple[bytes, dict[str, np.ndarray]]:
    """A model that reads a shape from a graph input, with that input fixed to its fed value (the
    IR needs shapes constant; a user fixes them before compiling, the ONNX backend does it per
    call), and the feeds left; other models as they are."""
    try:
        load_model(data)
        return data, feeds
    except ShapeInferenceError:
        proto = onnx.load_from_string(data)
        bound = set(_shape_deciding_inputs(proto))
        if not bound:
            raise
    kept = [i for i in proto.graph.input if i.name not in bound]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(feeds[k], k) for k in sorted(bound))
    return proto.SerializeToString(), {k: v for k, v in feeds.items() if k not in bound}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("key", _conformance_models())
def test_a_shipped_suite_model_runs_on_a_site(key, target, coordinator, build_cache, tmp_path):
    # prepare
    folder = conformance.model_dirs()[key]
    proto = onnx.load(str(folder / "model.onnx"))
    names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    inputs, stored = conformance.data_sets(folder)[0]
    data, feeds = _bound(proto.SerializeToString(), dict(zip(names, inputs)))
    try:  # onnxruntime is the reference where it runs the model; the suite's stored outputs elsewhere
        want, rtol, atol = list(_expected(data, feeds).values()), RTOL, ATOL
    except OrtNotImplemented:  # no ORT kernel at these old opsets (13 models: AvgPool, PReLU at opset 6)
        want, rtol, atol = stored, SUITE_RTOL, SUITE_ATOL
    # act
    _, model = site_runs(coordinator, coordinator.package(key, data, target), target, tmp_path / "state",
                         build_cache)
    got = model.run(feeds)
    # assert
    outputs = [o.name for o in proto.graph.output]
    assert len(want) == len(outputs)
    for output, expected in zip(outputs, want):
        np.testing.assert_allclose(got[output], expected, rtol=rtol, atol=atol, err_msg=f"{key}: {output}")


def test_the_set_is_all_there():
    assert {"cnn_reshape_flatten", "lstm", "gru"} <= set(MODELS)
    assert len(exports.EXPORTS) + len(architectures.ARCHITECTURES) + 3 == len(MODELS)
    assert len(_conformance_models()) > 90
