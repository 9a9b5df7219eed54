"""The Python API: compile a model for a device target, plan a federation, simulate it.

A top-level facade, like the CLI (layer 6): it composes the same coordinator and device-target
functions that `cuvil-edge compile --target`, `cuvil-edge plan` and `cuvil-edge demo` call, and turns
their results into data objects; it holds no logic of its own. ``cuvil_edge`` re-exports these names
lazily, and every heavy import (onnx, torch, flwr, opacus) happens inside the function that needs it,
so ``import cuvil_edge`` stays cheap.

    import cuvil_edge
    m = cuvil_edge.compile("model.onnx", target="rpi4", precision="int8", calibration=samples)
    probs = m(x)                                   # a numpy array in, a numpy array out
    plans = cuvil_edge.plan("configs/federation.yaml")
    result = cuvil_edge.simulate("configs/federation.yaml", rounds=1)
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil_edge.errors import ConfigError, ExecutionError, ModelError
from cuvil_edge.extras import require

if TYPE_CHECKING:
    from cuvil_edge.config import FederationConfig
    from cuvil_edge.coordinator.plan import SitePlan
    from cuvil_edge.device_targets import CompiledModel, TargetSpec
    from cuvil_edge.device_targets.memory_plan import MemoryPlan
    from cuvil_edge.ir.graph import Graph

#: What :func:`compile` and :func:`plan` accept as a model: a path, serialized ONNX, or an
#: ``onnx.ModelProto`` (typed loosely so that this module never imports onnx at import time).
ModelSource = str | os.PathLike | bytes | bytearray | memoryview | Any
#: Calibration samples for int8: an ``.npz`` path, one array (a single-input model) or one array per
#: input name, samples along the first axis.
Calibration = str | os.PathLike | np.ndarray | Mapping[str, Any]

PRECISIONS = ("fp32", "fp16", "int8")

_build_cache: Path | None = None


class Model:
    """A model compiled for one target, called on numpy arrays.

    ``m(x)`` for a single-input model, ``m(name=x, ...)`` or ``m({"name": x})`` for any model; the
    result is the output array when the model has one output, else a dict by output name. Inputs
    are checked, not converted: a float64 array for a float32 input is an :class:`ExecutionError`
    that says to cast it, as onnxruntime refuses it too.
    """

    def __init__(self, compiled: CompiledModel, precision: str, note: str) -> None:
        self._compiled = compiled
        #: the precision the weights were stored at: fp32, fp16 or int8
        self.precision = precision
        #: what setting the precision did (the same note `cuvil-edge compile` prints)
        self.note = note

    @property
    def graph(self) -> Graph:
        """The IR graph the module runs (optimized, weights as the device holds them after loading)."""
        return self._compiled.graph

    @property
    def target(self) -> str:
        """The device target's name."""
        return self._compiled.target.name

    @property
    def spec(self) -> TargetSpec:
        """The device target's spec (capabilities, memory, cost-model rates)."""
        return self._compiled.target

    @property
    def source(self) -> str:
        """The generated, pruned Python module that runs: the code to read when a result surprises."""
        return self._compiled.source

    @property
    def inputs(self) -> dict[str, tuple[str, list]]:
        """Input name -> (dtype, shape); a string in a shape is a symbolic axis such as ``batch``."""
        return {v.name: (v.type.dtype, list(v.type.shape)) for v in self.graph.inputs}

    @property
    def outputs(self) -> dict[str, tuple[str, list]]:
        """Output name -> (dtype, shape)."""
        return {v.name: (v.type.dtype, list(v.type.shape)) for v in self.graph.outputs}

    @property
    def build_seconds(self) -> float:
        """How long the local build took (a cache hit takes milliseconds)."""
        return self._compiled.build_seconds

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on ``feeds`` (input name -> array) and return every output by name.

        Raises:
            ExecutionError: missing or extra inputs, a wrong dtype or shape, or the module failed.
        """
        if not isinstance(feeds, Mapping):
            raise ExecutionError(
                f"feeds must map input names to arrays, got {type(feeds).__name__}; the model takes {list(self.inputs)}"
            )
        return self._compiled.run(feeds)

    def __call__(self, *args: Any, **feeds: np.ndarray) -> np.ndarray | dict[str, np.ndarray]:
        """``m(x)``, ``m(name=x)`` or ``m({"name": x})``: one output array, or a dict of them.

        Raises:
            ExecutionError: as :meth:`run`, or the inputs were passed in a way this model cannot take.
        """
        names = list(self.inputs)
        if args and feeds or len(args) > 1:
            raise ExecutionError(
                f"pass the inputs one way: m(x) for a single input, or m({names[0]}=...) / "
                f"m({{...}}) by name; the model takes {names}"
            )
        if args and isinstance(args[0], Mapping):
            feeds = dict(args[0])
        elif args:
            if len(names) != 1:
                raise ExecutionError(
                    f"the model takes {len(names)} inputs {names}: pass them by name, "
                    f"m({', '.join(f'{n}=...' for n in names)})"
                )
            feeds = {names[0]: args[0]}
        outputs = self.run(feeds)
        return next(iter(outputs.values())) if len(outputs) == 1 else outputs

    def memory_plan(self, batch: int = 1) -> MemoryPlan:
        """The planned peak memory of one run on ``batch`` samples (weights, live activations, the
        kernels' scratch), as `cuvil-edge compile --report` prints it.

        Raises:
            BuildError: ``batch`` does not fit the graph.
        """
        return self._compiled.memory_plan(batch)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}: {d}{s}" for n, (d, s) in self.inputs.items())
        return f"<cuvil_edge.Model {self.graph.name!r} for {self.target} ({self.precision}); inputs {shapes}>"


@dataclass(frozen=True)
class _Payload:
    """What device_targets.build needs: the graph as loaded and the digest of its encoded payload
    (the agent builds a verified package the same way)."""

    graph: Graph
    payload_digest: str


def compile(
    model: ModelSource,
    target: str = "x86-64",
    precision: str = "fp32",
    calibration: Calibration | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
) -> Model:
    """Import and optimize ``model``, store its weights at ``precision``, and build it for ``target``
    here, as a device of that target would build the package: the same module, run on this host.

    ``model``: an ONNX file path, serialized ONNX bytes or an ``onnx.ModelProto``. ``precision``:
    ``fp32``; ``fp16`` (half-precision weight storage; a target without fp16 widens them at load);
    or ``int8`` (weights per channel, activations per tensor), calibrated on ``calibration`` samples
    (an ``.npz`` path, an array for a single-input model, or one array per input name; samples
    along the first axis) or, without them, on standard-normal inputs (``Model.note`` says so).
    ``cache_dir``: where builds are cached (a private directory); by default one temporary
    directory per process, removed at exit, so nothing is written to your home unasked.

    Raises:
        UnknownTargetError: ``target`` names no target spec (the message lists them).
        ConfigError: an unknown precision, or unusable calibration samples.
        ModelFileError / MalformedModelError / UnsupportedOpError / ModelError: the model cannot be
            read or imported (a wrong type of ``model`` included).
        PassError: an optimization or quantization pass failed (it is named).
        BuildError: the target cannot build the graph.
    """
    from cuvil_edge.coordinator.precision import with_precision
    from cuvil_edge.device_targets import build, load_target
    from cuvil_edge.ir_serialize import encode_payload
    from cuvil_edge.passes import optimize
    from cuvil_edge.passes.quantize import dequantize_at_load

    spec = load_target(target)
    _check_precision(precision)
    graph, _ = optimize(_import(model))
    samples = None if calibration is None else _calibration_batches(calibration, graph)
    graph, note = with_precision(graph, precision, samples)
    digest = hashlib.sha256(encode_payload(graph)).hexdigest()
    # as the agent does: stored fp16/int8 weights widened once at load, fp16 compute where the target has it
    compute = "fp16" if precision == "fp16" and spec.fp16 else "fp32"
    cache = Path(cache_dir) if cache_dir is not None else _default_cache()
    loaded = dequantize_at_load(graph, int8=precision == "int8" and spec.int8_kernels)  # int8 stays int8 there
    compiled = build(_Payload(loaded, digest), spec, cache_dir=cache, precision=compute)
    return Model(compiled, precision, note)


def plan(federation: str | os.PathLike | FederationConfig, model: ModelSource | None = None) -> list[SitePlan]:
    """Each site's compile plan, as `cuvil-edge plan` prints it: per precision the package bytes,
    planned peak memory, predicted latency and round time against the site's ``limits``, and the
    precision chosen and why (``chosen`` is None when nothing fits: such a site is sent nothing).

    ``federation``: a federation YAML path or a loaded ``FederationConfig``. ``model``: plan this
    model (path, bytes or ModelProto) instead of the federation's own.

    Raises:
        ConfigError: the federation, a site file or the calibration file is invalid.
        ModelError: the model cannot be imported.
    """
    from cuvil_edge.config import FederationConfig, load_federation
    from cuvil_edge.coordinator.model import load_federation_model
    from cuvil_edge.coordinator.plan import default_latency, plan_federation, precision_variants
    from cuvil_edge.coordinator.precision import federation_calibration

    config = (
        federation if isinstance(federation, FederationConfig) else load_federation(_path(federation, "federation"))
    )
    graph = load_federation_model(config.model, config.seed) if model is None else _import(model)
    calibration = federation_calibration(config.quantization.calibration, graph)
    variants = precision_variants(graph, calibration, config.quantization.method)
    return plan_federation(graph, config.load_sites(), variants, default_latency())


def _check_precision(precision: str) -> None:
    """Raises: ConfigError: ``precision`` is not one of :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")


def _path(value: Any, what: str) -> Path:
    """Raises: ConfigError: ``value`` is not a path."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{what} must be a path to a YAML file, not {type(value).__name__}")
    return Path(value)


def _import(model: ModelSource) -> Graph:
    """The model as an IR graph.

    Raises:
        ModelError: ``model`` is not a path, bytes or ModelProto (or load_model's own errors).
        MissingDependencyError: onnx is not installed.
    """
    require(("onnx",), "compiling a model needs onnx", "coordinator")
    import onnx

    from cuvil_edge.frontend import load_model

    if not isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto)):
        raise ModelError(
            f"model must be an ONNX file path, serialized ONNX bytes or an onnx.ModelProto, not {type(model).__name__}"
        )
    return load_model(model if not isinstance(model, os.PathLike) else Path(model))


def _calibration_batches(calibration: Calibration, graph: Graph) -> list[dict[str, np.ndarray]]:
    """Calibration samples as feed-dict batches, checked as an ``.npz`` file is (precision.py).

    Raises:
        ConfigError: the file or arrays do not match the model's inputs, or hold no sample.
    """
    from cuvil_edge.coordinator.precision import calibration_batches, load_calibration

    if isinstance(calibration, (str, os.PathLike)):
        return load_calibration(Path(calibration), graph)
    inputs = [v.name for v in graph.inputs]
    if isinstance(calibration, Mapping):
        arrays = {str(k): np.asarray(v) for k, v in calibration.items()}
    elif isinstance(calibration, np.ndarray) and len(inputs) == 1:
        arrays = {inputs[0]: calibration}
    else:
        raise ConfigError(
            f"calibration must be an .npz path, an array (single-input model) or one array per "
            f"input {inputs}, not {type(calibration).__name__}"
        )
    return calibration_batches(arrays, graph, "calibration")


def _default_cache() -> Path:
    """One private build cache per process (mkdtemp makes it 0700), removed at exit."""
    global _build_cache
    if _build_cache is None:
        _build_cache = Path(tempfile.mkdtemp(prefix="cuvil-edge-builds-"))
        atexit.register(shutil.rmtree, _build_cache, True)
    return _build_cache


@dataclass(frozen=True)
class SiteRound:
    """One site's part of one round, as the demo's round table shows it (``stats``: every field the
    site reported, by the names metrics.json uses)."""

    site: str
    target: str
    status: str | None  # "ok", "budget exhausted", "failed", "not pushed"; None in round 0
    precision: str | None
    eps_spent: float | None
    eps_remaining: float | None
    #: the site's noisy correct / noisy total on its evaluation records (discrete Laplace), in [0, 1]
    local_accuracy: float | None
    package_bytes: int | None
    stats: Mapping[str, Any]

    @classmethod
    def from_dict(cls, site: str, stats: Mapping[str, Any]) -> SiteRound:
        """One entry of a round's ``sites`` in metrics.json."""
        return cls(
            site,
            stats.get("target", ""),
            stats.get("status"),
            stats.get("precision"),
            stats.get("eps-spent"),
            stats.get("eps-remaining"),
            stats.get("eval-accuracy"),
            stats.get("package-bytes"),
            dict(stats),
        )


@dataclass(frozen=True)
class RoundMetrics:
    """One round: round 0 is the initial model, evaluated before any training."""

    round: int
    #: the global model on the coordinator's own public test set
    global_accuracy: float
    sites: Mapping[str, SiteRound]
    #: the sites' pooled accuracy from their noisy counts with its 95 % interval (None: no estimate)
    pooled_accuracy: Mapping[str, Any] | None
    #: central DP's accounting (None without central DP)
    central_dp: Mapping[str, Any] | None
    seconds: float

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> RoundMetrics:
        """One entry of metrics.json's ``rounds``."""
        return cls(
            entry["round"],
            entry["global_accuracy"],
            {name: SiteRound.from_dict(name, s) for name, s in entry.get("sites", {}).items()},
            entry.get("federated_accuracy"),
            entry.get("central_dp"),
            entry.get("seconds", 0.0),
        )


@dataclass(frozen=True)
class Simulation:
    """A finished simulated run: its rounds (round 0 first), and where its files are."""

    run_dir: Path  # metrics.json, metrics.png, the SuperLink's log and Flower's state of this run
    home: Path  # the federation home: keys, counters, every site's state and privacy ledger
    rounds: tuple[RoundMetrics, ...]
    #: why the run ended before its rounds (central DP's max_epsilon), or None
    stopped_early: Mapping[str, Any] | None

    @property
    def final(self) -> RoundMetrics:
        """The last round."""
        return self.rounds[-1]


def simulate(
    federation: str | os.PathLike,
    rounds: int | None = None,
    *,
    home: str | os.PathLike | None = None,
    run_dir: str | os.PathLike | None = None,
    resume: bool = False,
    verbose: bool = False,
) -> Simulation:
    """Run ``federation`` in Flower simulation, as `cuvil-edge demo` does, and return its rounds.

    A simulation SuperLink on 127.0.0.1 is started for this run and stopped after it (Flower's own
    state, FLWR_HOME included, lives in the run directory, never in your Flower home); the sites
    run as Ray actors in its processes. ``rounds`` overrides the federation's. ``home`` (default
    ``.cuvil``, as the demo's) keeps keys, counters and every site's privacy ledger across runs, so a
    second run spends from the same budgets; pass a new directory to start afresh. ``run_dir``
    defaults to ``runs/<name>-<time>``. Each round's table is printed as the demo prints it;
    ``verbose`` adds Flower's and Ray's own logs.

    Raises:
        ConfigError: the federation or a site file is invalid.
        RunFailedError: the run did not complete its rounds (the message names the log).
        DeploymentError: the simulation SuperLink did not start.
    """
    from cuvil_edge.config.flower_app import APP_DIR
    from cuvil_edge.coordinator.launcher import prepare_run, run_in_simulation

    if rounds is not None and (not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1):
        raise ConfigError(f"rounds must be a positive integer, got {rounds!r}")
    spec = prepare_run(
        _path(federation, "federation"),
        None if run_dir is None else Path(run_dir),
        rounds,
        home=None if home is None else Path(home),
        resume=resume,
    )
    with _quiet_flower(verbose):
        metrics = run_in_simulation(spec, APP_DIR, verbose=verbose)
    return Simulation(
        Path(spec.run_dir),
        Path(spec.home),
        tuple(RoundMetrics.from_dict(r) for r in metrics["rounds"]),
        metrics.get("stopped_early"),
    )


@contextmanager
def _quiet_flower(verbose: bool) -> Iterator[None]:
    """Flower's processes at log level WARNING unless ``verbose`` or the caller set FLWR_LOG_LEVEL,
    as the demo runs them; the caller's environment is restored afterwards."""
    if verbose or "FLWR_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["FLWR_LOG_LEVEL"] = "WARNING"
    try:
        yield
    finally:
        os.environ.pop("FLWR_LOG_LEVEL", None)


__all__ = ["Model", "RoundMetrics", "SiteRound", "Simulation", "compile", "plan", "simulate"]
