"""``onnx.backend.base.Backend`` over the Cuvil IR, so ONNX's conformance suites run against us.

``CuvilBackend.prepare(model, mode="interpreter" | "compiled")`` imports the model with
:func:`~cuvil_edge.frontend.onnx_import.load_model`; the returned :class:`CuvilBackendRep`
runs it with the reference interpreter or with the module
:func:`cuvil_edge.device_targets.build` generates for the ``x86-64`` target (cached by
the sha256 of the serialized model in ``cache_dir``, a temporary folder by default).
Errors stay typed :class:`~cuvil_edge.errors.CuvilError` subclasses.

Shape-deciding inputs (Reshape's shape, Slice's starts, ReduceSum's axes ...) must be
constants in the IR.  When a model feeds them as graph inputs, as ONNX's node tests do,
import fails with a ShapeInferenceError; the rep then waits for the first run and
imports the model with those inputs bound to the fed values (a specialisation,
rebuilt whenever those values change).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from cuvil_edge.errors import ConfigError, ExecutionError, ShapeInferenceError
from cuvil_edge.frontend.onnx_import import load_model
from cuvil_edge.ir import interpreter, ops
from cuvil_edge.ir.graph import Graph

MODES = ("interpreter", "compiled")
TARGET = "x86-64"
_default_cache: Path | None = None


@dataclass(frozen=True)
class _BuildInput:
    """What ``device_targets.build`` needs: a graph and a payload digest (here: of the ONNX bytes)."""

    graph: Graph
    payload_digest: str


class CuvilBackendRep(BackendRep):
    """A prepared model; :meth:`run` returns its outputs as a tuple in graph output order."""

    def __init__(self, graph: Graph, runner: Any, mode: str) -> None:
        self.graph = graph
        self.mode = mode
        self._runner = runner

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run on ``inputs``: a sequence in graph input order, a mapping by name, or one array.

        Raises:
            ExecutionError: wrong number, names, dtypes or shapes of inputs, or a kernel failed.
        """
        feeds = self._feeds(inputs, [v.name for v in self.graph.inputs])
        outputs = self._runner(feeds)
        return tuple(outputs[v.name] for v in self.graph.outputs)

    def _feeds(self, inputs: Any, names: list[str]) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            pairs = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
                inputs = [inputs]
            if len(inputs) != len(names):
                raise ExecutionError(
                    f"the model takes {len(names)} inputs {names}, got {len(inputs)}; feed them in that order"
                )
            pairs = dict(zip(names, inputs, strict=True))
        return {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in pairs.items()}


class CuvilBackend(Backend):
    """ONNX backend running models through the Cuvil IR (CPU only)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto | bytes, device: str = "CPU", **kwargs: Any) -> CuvilBackendRep:
        """Import ``model``; ``mode`` picks the interpreter (default) or the compiled x86-64 module.

        Keyword arguments: ``mode``, ``cache_dir`` (compiled mode's build cache).

        Raises:
            ConfigError: an unknown device or mode.
            ModelError: the model cannot be imported (see ``load_model``).
            TargetError: the compiled module cannot be built (BuildError).
        """
        if not cls.supports_device(device):
            raise ConfigError(f"device {device!r} is not supported; cuvil-edge's ONNX backend runs on 'CPU'")
        mode = kwargs.get("mode", "interpreter")
        if mode not in MODES:
            raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        data = model if isinstance(model, bytes) else model.SerializeToString(deterministic=True)
        try:
            graph = load_model(data)
        except ShapeInferenceError as e:
            proto = onnx.load_from_string(data)
            bound = _shape_deciding_inputs(proto)
            if not bound:
                raise
            return _SpecialisingRep(proto, bound, mode, kwargs.get("cache_dir"), e)
        return cls._rep(graph, data, mode, kwargs.get("cache_dir"))

    @staticmethod
    def _rep(graph: Graph, data: bytes, mode: str, cache_dir: Any) -> CuvilBackendRep:
        if mode == "interpreter":
            return CuvilBackendRep(graph, lambda feeds: interpreter.run(graph, feeds), mode)
        from cuvil_edge.device_targets.build import build

        digest = hashlib.sha256(data).hexdigest()
        compiled = build(_BuildInput(graph, digest), TARGET, cache_dir=cache_dir or _cache_dir())
        return CuvilBackendRep(graph, compiled.run, mode)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper() == "CPU"


def _shape_deciding_inputs(proto: onnx.ModelProto) -> list[str]:
    """Graph inputs whose values reach an op input listed in its module's ``CONST_INPUTS``,
    directly or through other nodes (``Max(Shape(x), shape) -> ... -> Pad``); a ``Shape``
    node reads only its input's type, so the walk stops there."""
    producer = {out: node for node in proto.graph.node for out in node.output if out}
    pending = [
        node.input[i]
        for node in proto.graph.node
        for i in getattr(ops.registry().get(node.op_type), "CONST_INPUTS", ())
        if i < len(node.input) and node.input[i]
    ]
    reached: set[str] = set()
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        reached.add(name)
        node = producer.get(name)
        if node is not None and node.op_type != "Shape":
            pending.extend(i for i in node.input if i)
    return [i.name for i in proto.graph.input if i.name in reached]


class _SpecialisingRep(CuvilBackendRep):
    """A model whose graph inputs decide shapes: imported per distinct value of those inputs."""

    def __init__(self, proto: onnx.ModelProto, bound: list[str], mode: str, cache_dir: Any, error: Exception) -> None:
        self.proto, self.bound, self.mode, self.cache_dir, self.error = proto, bound, mode, cache_dir, error
        self.input_names = [
            i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}
        ]
        self._reps: dict[bytes, CuvilBackendRep] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Bind the shape-deciding inputs to their fed values, import (once per value), and run.

        Raises:
            ExecutionError: bad inputs or a failed kernel.
            ModelError: the model cannot be imported even with those inputs bound.
        """
        feeds = self._feeds(inputs, self.input_names)
        consts = {k: np.asarray(feeds[k]) for k in self.bound if k in feeds}
        key = b"".join(
            k.encode() + b"\0" + v.dtype.str.encode() + str(v.shape).encode() + v.tobytes()
            for k, v in sorted(consts.items())
        )
        rep = self._reps.get(key)
        if rep is None:
            model = onnx.ModelProto()
            model.CopyFrom(self.proto)
            kept = [i for i in model.graph.input if i.name not in consts]
            del model.graph.input[:]
            model.graph.input.extend(kept)
            model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in consts.items())
            data = model.SerializeToString(deterministic=True)
            rep = self._reps[key] = CuvilBackend._rep(load_model(data), data, self.mode, self.cache_dir)
        return rep.run({k: v for k, v in feeds.items() if k not in consts})


def _cache_dir() -> Path:
    global _default_cache
    if _default_cache is None:
        _default_cache = Path(tempfile.mkdtemp(prefix="cuvil-onnx-backend-"))
    return _default_cache


prepare = CuvilBackend.prepare
run_model = CuvilBackend.run_model
supports_device = CuvilBackend.supports_device
