"""`cuvil-edge compile` and `cuvil-edge inspect`: one model, one site, one package file."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config import load_site
from cuvil_edge.coordinator.keys import load_signing_keys
from cuvil_edge.coordinator.packaging import VersionCounter
from cuvil_edge.coordinator.precision import load_calibration, with_precision
from cuvil_edge.device_targets import list_targets, load_target
from cuvil_edge.device_targets.memory_plan import plan_memory
from cuvil_edge.errors import ConfigError, CuvilError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir.cost import node_flops, total_flops, total_macs
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.infer import with_sizes
from cuvil_edge.ir_serialize import (
    describe_package,
    encode_payload,
    load_pinned_root,
    load_public_key,
    sign_release,
    write_package,
)
from cuvil_edge.passes import OptimizeReport, optimize

#: `inspect` reads files up to this size (the agent applies its own, configured limit).
INSPECT_MAX_BYTES = 4 * 1024**3


@dataclass(frozen=True)
class CompileReport:
    """What optimizing a model did, and the cost of the result (batch 1)."""

    passes: list[tuple[str, int, int, list[str]]]  # (pass, nodes before, nodes after, changes)
    iterations: int
    nodes_before: int
    nodes_after: int
    flops: int
    macs: int
    parameter_bytes: int
    #: per target: (target, planned peak bytes at batch 1, weights bytes, the plan's bound) or
    #: (target, None, None, why it cannot be planned)
    memory: list[tuple] = field(default_factory=list)


@dataclass(frozen=True)
class CompileResult:
    site: str
    target: str
    version: int
    size: int
    nodes: int
    report: CompileReport | None = None
    precision_note: str = "fp32 weights"


def _report(graph: Graph, report: OptimizeReport, sizes: Mapping[str, int] | None = None) -> CompileReport:
    memory: list[tuple] = []
    planned = with_sizes(graph, sizes or {})
    for target in list_targets():
        spec = load_target(target)
        try:  # as the device will build it: its native kernels when its spec has them
            plan = plan_memory(planned, spec, native=spec.native_kernels)
            memory.append((target, plan.peak_bytes, plan.weights_bytes, plan.bound_bytes))
        except CuvilError as e:
            memory.append((target, None, None, str(e)))
    return CompileReport(
        report.per_pass(),
        report.iterations,
        report.nodes_before,
        report.nodes_after,
        total_flops(graph),
        total_macs(graph),
        graph.parameter_bytes(),
        memory,
    )


def optimize_model(model: Path, sizes: Mapping[str, int] | None = None) -> tuple[Graph, CompileReport]:
    """Import ``model`` and run the default optimization pipeline; writes nothing. ``sizes`` fixes
    dynamic axes other than the batch for the report's memory plans (``{"seq": 128}``).

    Raises:
        ConfigError: the model file does not exist.
        ModelError: the model is malformed or unsupported.
        PassError: an optimization pass failed (it is named).
        ShapeInferenceError: ``sizes`` names an axis the model's inputs lack, or a bad size.
        PackageFormatError: the optimized graph could not be written as a package (a graph input or
            output name the package refuses, such as ``x:0``).
    """
    if not model.is_file():
        raise ConfigError(f"{model}: model file not found")
    graph, report = optimize(load_model(model))
    encode_payload(graph)  # what would not package is an error here, not after the report said "ok"
    return graph, _report(graph, report, sizes)


def compile_for_site(
    model: Path,
    site_file: Path,
    output: Path,
    key: Path,
    validity: int,
    versions: Path,
    precision: str = "fp32",
    calibration: Path | None = None,
) -> CompileResult:
    """Import and optimize ``model`` and write a package signed for the site in ``site_file``, its
    weights at ``precision`` (:mod:`coordinator.precision`).

    Raises:
        ModelError: the model is malformed or unsupported.
        PassError: an optimization pass failed (it is named).
        ConfigError: the site file, key or calibration file is invalid.
    """
    if not model.is_file():
        raise ConfigError(f"{model}: model file not found")
    site = load_site(site_file)
    keys = load_signing_keys(key)
    graph, report = optimize_model(model)
    graph, note = with_precision(graph, precision, load_calibration(calibration, graph) if calibration else None)
    counters = VersionCounter(versions)
    version = counters.next(site.site)
    payload = encode_payload(graph)
    release = sign_release(payload, "model", counters.next("release:model"), [site.target], keys.release)
    now = int(time.time())
    data = write_package(
        None,
        site=site.site,
        target=site.target,
        version=version,
        signing_key=keys.coordinator,
        issued_at=now,
        expires=now + validity,
        release=release,
        payload=payload,
        roots=keys.roots,
    )
    atomic_write(output, data, mode=0o644)
    return CompileResult(site.site, site.target, version, len(data), len(graph.nodes), report, note)


def compile_for_target(
    model: Path, target: str, output: Path, precision: str = "fp32", calibration: Path | None = None
) -> CompileResult:
    """Import and optimize ``model``, set its precision, check that ``target`` builds and runs it
    (a local build and one run on zeros), and write the payload: the IR container a per-site
    package carries, unsigned (``--site`` signs a package for one site).

    Raises:
        ModelError, PassError, ConfigError: as :func:`compile_for_site`.
        TargetError: ``target`` is unknown or cannot build the model (BuildError says why).
    """
    import tempfile

    import numpy as np

    from cuvil_edge.device_targets import build
    from cuvil_edge.passes.quantize import dequantize_at_load

    graph, report = optimize_model(model)
    graph, note = with_precision(graph, precision, load_calibration(calibration, graph) if calibration else None)
    spec = load_target(target)
    payload = encode_payload(graph)

    class _Local:  # what build() needs; the payload's own digest keys the cache
        def __init__(self, g: Graph) -> None:
            self.graph, self.payload_digest = g, hashlib.sha256(payload).hexdigest()

    loaded = dequantize_at_load(graph)  # as the agent does before it builds
    with tempfile.TemporaryDirectory() as cache:
        compiled = build(_Local(loaded), spec, cache_dir=Path(cache))
        compiled.run(
            {
                v.name: np.zeros(tuple(1 if isinstance(d, str) else d for d in v.type.shape), v.type.dtype)
                for v in loaded.inputs
            }
        )
    atomic_write(output, payload, mode=0o644)
    return CompileResult("-", spec.name, 0, len(payload), len(graph.nodes), report, note)


@dataclass(frozen=True)
class PackageInfo:
    signature: str
    manifest: dict[str, Any]
    ops: dict[str, tuple[int, int]]  # op -> (count, FLOPs)
    tensors: list[tuple[str, str, list[int], int]]
    total_flops: int
    parameter_bytes: int


def inspect_package(path: Path, public_key: Path | None = None) -> PackageInfo:
    """Describe a package file; verifies the signature only when a key is given.

    Raises:
        PackageError: the file is not a well-formed package (or the signature fails).
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read package ({e.strerror})") from e
    trust_root = coordinator_key = None
    if public_key is not None and public_key.suffix == ".json":  # a trust root: both signatures, by role
        trust_root = load_pinned_root(_read(public_key))
    elif public_key is not None:
        coordinator_key = load_public_key(public_key)
    info = describe_package(data, max_bytes=INSPECT_MAX_BYTES, trust_root=trust_root, coordinator_key=coordinator_key)
    manifest, release, graph, signature = info.manifest, info.release, info.graph, info.signature
    if graph is None:
        raise ConfigError(f"{path}: the payload is sealed for site {manifest.site!r}; only that site can inspect it")
    flops = node_flops(graph)
    per_op: dict[str, tuple[int, int]] = {}
    for node in graph.nodes:
        count, total = per_op.get(node.op_type, (0, 0))
        per_op[node.op_type] = (count + 1, total + flops[node.name])
    tensors = [(name, str(a.dtype), list(a.shape), int(a.nbytes)) for name, a in sorted(graph.initializers.items())]
    shown = {k: v for k, v in manifest.to_dict().items() if k != "regions"}
    shown.update(regions=len(manifest.regions), release_counter=release.release_counter)
    return PackageInfo(signature, shown, per_op, tensors, sum(flops.values()), graph.parameter_bytes())


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from e
