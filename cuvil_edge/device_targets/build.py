"""Local build: package + target -> generated, pruned, compiled module, cached on disk.

Cache layout (one folder per key)::

    <cache_dir>/<key>/module.py   the pruned source that runs, for people to read
    <cache_dir>/<key>/meta.json   what it was built from, and the source's sha256

``key`` is sha256 over (the graph's structure digest, target name, target spec
digest, precision, :data:`COMPILER_VERSION`, op templates digest).  The module takes
the weights as an argument at run time, so its source depends on the graph's structure
only (:func:`structure_digest`): the next round's package, same model with new weights,
hits the cache.  Both files are written atomically (temp file + rename), meta.json
last, so a half-written entry is never taken for a hit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import BuildError, CuvilError, ExecutionError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.interpreter import bind_inputs
from cuvil_edge.device_targets import codegen
from cuvil_edge.device_targets.prune import prune
from cuvil_edge.device_targets.spec import TargetSpec, resolve

logger = logging.getLogger(__name__)

#: Bump when codegen, pruning or the cache layout change in a way that changes built modules.
COMPILER_VERSION = f"cuvil-edge-compiler/1+codegen{codegen.CODEGEN_VERSION}"


@runtime_checkable
class BuildInput(Protocol):
    """What build() needs from a package (ir_serialize's VerifiedPackage fits)."""

    @property
    def graph(self) -> Graph: ...

    @property
    def payload_digest(self) -> str: ...


@dataclass(frozen=True, eq=False)
class CompiledModel:
    """A module compiled for one target; :meth:`run` executes it."""

    graph: Graph
    target: TargetSpec
    precision: str
    key: str
    source: str
    source_path: Path
    build_seconds: float
    cache_hit: bool
    _entry: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], dict] = field(repr=False)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on ``feeds`` (input name -> array); returns outputs by name.

        Raises:
            ExecutionError: bad feeds (as :func:`ir.interpreter.bind_inputs`), or the module failed.
        """
        bind_inputs(self.graph, feeds)
        try:
            outputs = self._entry(self.graph.initializers, dict(feeds))
        except CuvilError:
            raise
        except Exception as e:  # generated code fault: say which module to read
            raise ExecutionError(
                f"compiled module for target {self.target.name!r} failed: {type(e).__name__}: {e} "
                f"(source: {self.source_path})"
            ) from e
        return {v.name: outputs[v.name] for v in self.graph.outputs}


def structure_digest(graph: Graph) -> str:
    """sha256 of everything code generation reads from ``graph``: its structure (nodes, attributes,
    names, opset), every value's type, and each initializer's dtype and shape, plus the values of
    the non-floating ones (shape and index tensors, which shape inference and batch planning may
    read). Floating-point weight values are left out: the module receives them when it runs."""
    h = hashlib.sha256(json.dumps(graph.to_dict(), sort_keys=True).encode())
    h.update(json.dumps({k: t.to_dict() for k, t in graph.types.items()}, sort_keys=True).encode())
    for name in sorted(graph.initializers):
        array = np.asarray(graph.initializers[name])
        h.update(f"\0{name}\0{array.dtype.str}\0{array.shape}".encode())
        if array.dtype.kind != "f":
            h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def cache_key(structure: str, target: TargetSpec, precision: str) -> str:
    """The cache key of a build (hex sha256); ``structure`` is :func:`structure_digest` of the graph."""
    parts = {
        "structure": structure,
        "target": target.name,
        "target_spec": target.digest(),
        "precision": precision,
        "compiler": COMPILER_VERSION,
        "templates": codegen.templates_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


#: CPython 3.11's AST constructors are not safe to run from two threads at once (concurrent
#: ``ast.parse``/``compile`` of AST objects raise "SystemError: AST constructor recursion depth
#: mismatch"); an agent handling two deliveries at once builds one module at a time.
_AST_LOCK = threading.Lock()


def build(
    package: BuildInput,
    target: TargetSpec | str,
    *,
    cache_dir: Path | str,
    precision: str = "fp32",
) -> CompiledModel:
    """Generate, prune and compile the package's graph for ``target``, or load it from the cache.

    Raises:
        UnknownTargetError: ``target`` names no spec.
        TargetError: the target does not support ``precision``.
        BuildError: the graph cannot run on this target (e.g. non-batch symbolic
            dims on a static-shape target), or generating/compiling failed.
        ModelError: the graph uses an op the registry does not have (UnsupportedOpError).
    """
    start = time.perf_counter()
    spec = resolve(target)
    constants = spec.capabilities(precision)
    graph, digest = package.graph, package.payload_digest
    if not isinstance(digest, str) or len(digest) < 16 or any(c not in "0123456789abcdef" for c in digest):
        raise BuildError(f"payload digest {digest!r} is not a lowercase hex string; pass the verified package")
    with _AST_LOCK:  # the key digests the templates' parsed source
        try:
            structure = structure_digest(graph)
        except ValueError:  # a graph to_dict() cannot describe (a big tensor attribute): key by payload
            structure = digest
        key = cache_key(structure, spec, precision)
    entry = Path(cache_dir) / key
    source = _read_cached(entry)
    hit = source is not None
    if source is None:
        try:
            if spec.static_shapes:
                codegen.batch_plan(graph)
            with _AST_LOCK:
                pruned = prune(codegen.generate_source(graph), constants)
        except BuildError as e:
            raise BuildError(f"cannot build graph {graph.name!r} for target {spec.name!r}: {e}") from e
        source = f"# target {spec.name}, precision {precision}, {COMPILER_VERSION}, cache key {key}\n" + pruned
        _write_entry(entry, source, {"payload_digest": digest, "target": spec.name, "target_spec": spec.digest(),
                                     "precision": precision, "compiler": COMPILER_VERSION, "graph": graph.name})
    run_fn = _compile(source, entry / "module.py", spec, key)
    seconds = time.perf_counter() - start
    logger.info("built %s for %s (%s) in %.3fs%s", graph.name, spec.name, precision, seconds, " (cached)" if hit else "")
    return CompiledModel(graph, spec, precision, key, source, entry / "module.py", seconds, hit, run_fn)


def _compile(source: str, path: Path, spec: TargetSpec, key: str) -> Callable[..., dict]:
    namespace: dict[str, Any] = {"__name__": f"cuvil_edge_built_{key[:16]}"}
    try:
        with _AST_LOCK:
            code = compile(source, str(path), "exec")
        exec(code, namespace)  # noqa: S102 - our own generated, pruned source
    except Exception as e:
        raise BuildError(f"compiling the module for target {spec.name!r} failed: {type(e).__name__}: {e} "
                         f"(source: {path})") from e
    built_for = namespace.get("BUILT_FOR", {})
    if not callable(namespace.get("run")) or built_for.get("target") != spec.name:
        raise BuildError(f"module {path} is not a build for target {spec.name!r} (BUILT_FOR={built_for!r}); "
                         "delete that cache entry and build again")
    return namespace["run"]


def _read_cached(entry: Path) -> str | None:
    """The cached source if the entry is complete and intact, else None."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        source = (entry / "module.py").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("source_sha256") != hashlib.sha256(source.encode()).hexdigest():
        logger.warning("cache entry %s does not match its meta.json; rebuilding", entry)
        return None
    return source


def _write_entry(entry: Path, source: str, meta: dict[str, Any]) -> None:
    try:
        entry.mkdir(parents=True, exist_ok=True)
        atomic_write(entry / "module.py", source.encode("utf-8"), mode=0o644)
        meta = {**meta, "source_sha256": hashlib.sha256(source.encode()).hexdigest()}
        atomic_write(entry / "meta.json", (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode("utf-8"), mode=0o644)
    except OSError as e:
        raise BuildError(f"cannot write build cache entry {entry}: {e}; check cache_dir is writable") from e
