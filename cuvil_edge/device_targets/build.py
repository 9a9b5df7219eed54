"""Local build: package + target -> generated, pruned, compiled module, cached on disk.

Cache layout (one folder per key)::

    <cache_dir>/mac.key           32 random bytes (0600) that authenticate every entry, made on first use
    <cache_dir>/<key>/module.py   the pruned source that runs, for people to read
    <cache_dir>/<key>/module.code that source compiled (marshal), so a fresh process skips compile()
    <cache_dir>/<key>/meta.json   what it was built from, the source's sha256 and its MAC

``key`` is sha256 over (the graph's structure digest, target name, target spec
digest, precision, :data:`COMPILER_VERSION`, op templates digest).  The module takes
the weights as an argument at run time, so its source depends on the graph's structure
only (:func:`structure_digest`): the next round's package, same model with new weights,
hits the cache.  Every file is written atomically (temp file + rename, 0600), meta.json
last, so a half-written entry is never taken for a hit.

The cache holds code the agent runs, so it is private (:mod:`cuvil_edge.private_dir`): the
folder and each entry folder are created 0700, and the folder, an entry folder or a file read
from it that is a link, another user's, or writable by group or others is refused
(:class:`UnsafePathError`, naming the path and the fix). And a hit trusts nothing it reads
that the cache's own key did not authenticate: module.py is used only when meta.json's
``source_mac`` is HMAC-SHA256 (under ``mac.key``) of the entry's key and the source's exact
bytes (a sha256 alone is integrity, which anyone can recompute: not who wrote it), and
module.code only when its header names this Python's bytecode magic number and holds the MAC
of (entry key, that magic, the source's sha256, the marshalled bytes) -- anything else is
rebuilt (module.py: a miss, generated again; module.code: compiled again from the checked
source and rewritten), with a logged warning, never run.  The key lives in the cache folder
because build() knows only ``cache_dir`` (for an agent, ``<state_dir>/build-cache``, inside its
private state directory).  marshal, never pickle: it can only build code objects and
constants.  An agent is a long-lived daemon, so each process also keeps the code objects it
built or loaded (:data:`_MEMO`, by entry folder) and reuses one when the entry's checked
source is the one it was compiled from; each CompiledModel still gets a module namespace of
its own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import marshal
import os
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from cuvil_edge import private_dir
from cuvil_edge.atomic import atomic_write
from cuvil_edge.device_targets import codegen
from cuvil_edge.device_targets.prune import prune
from cuvil_edge.device_targets.spec import TargetSpec, resolve
from cuvil_edge.errors import BuildError, CuvilError, ExecutionError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.interpreter import bind_inputs

logger = logging.getLogger(__name__)

#: Bump when codegen, pruning or the cache layout change in a way that changes built modules
#: (2: module.code beside module.py; templates digested by file; 3: entries authenticated by a MAC).
COMPILER_VERSION = f"cuvil-edge-compiler/3+codegen{codegen.CODEGEN_VERSION}"
#: The build cache's MAC key, in the cache folder (see the module docstring).
KEY_FILE = "mac.key"


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

    def memory_plan(self, batch: int = 1):
        """The planned peak memory of a run on ``batch`` samples: weights + live activations +
        the kernels' scratch, in the module's order (:func:`memory_plan.plan_memory`).

        Raises:
            BuildError: ``batch`` does not fit the graph (see plan_memory).
        """
        from cuvil_edge.device_targets.memory_plan import plan_memory  # imports build's module lazily

        return plan_memory(self.graph, self.target, precision=self.precision, batch=batch)


def structure_digest(graph: Graph) -> str:
    """sha256 of everything code generation reads from ``graph``: its structure (nodes, attributes,
    names, opset), every value's type, and each initializer's dtype and shape, plus the values of
    the non-floating ones (shape and index tensors, which shape inference and batch planning may
    read). Floating-point weight values are left out: the module receives them when it runs. So are
    the values of quantization data (int8 weights, zero points) that only the quantization ops read:
    its kernels take them at run time, so a new round's int8 package reuses the build."""
    h = hashlib.sha256(json.dumps(graph.to_dict(), sort_keys=True).encode())
    h.update(json.dumps({k: t.to_dict() for k, t in graph.types.items()}, sort_keys=True).encode())
    readers: dict[str, set[str]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            readers.setdefault(name, set()).add(node.op_type)
    for name in sorted(graph.initializers):
        array = np.asarray(graph.initializers[name])
        h.update(f"\0{name}\0{array.dtype.str}\0{array.shape}".encode())
        if array.dtype.kind != "f" and not (readers.get(name) and readers[name] <= _RUNTIME_QUANT_READERS):
            h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


#: Ops whose non-float inputs (quantized values, zero points) reach the kernel at run time only: the
#: integer ops too, which a target with int8 kernels runs in place of the QDQ-wrapped products (each
#: round's int8 weights are new values of the same structure).
_RUNTIME_QUANT_READERS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
        "CuvilQLinearAdd",
    }
)


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
        UnsafePathError: ``cache_dir``, its key or an entry read is a link, another user's, or
            writable by group or others (nothing in it was run).
    """
    start = time.perf_counter()
    spec = resolve(target)
    constants = spec.capabilities(precision)
    graph, digest = package.graph, package.payload_digest
    if not isinstance(digest, str) or len(digest) < 16 or any(c not in "0123456789abcdef" for c in digest):
        raise BuildError(f"payload digest {digest!r} is not a lowercase hex string; pass the verified package")
    try:
        structure = structure_digest(graph)
    except ValueError:  # a graph to_dict() cannot describe (a big tensor attribute): key by payload
        structure = digest
    key = cache_key(structure, spec, precision)
    root = Path(cache_dir).absolute()
    mac_key = _mac_key(root)
    entry = root / key
    path = entry / "module.py"
    loaded = _load_entry(entry, mac_key)
    hit = loaded is not None
    if loaded is None:
        try:
            if spec.static_shapes:
                codegen.batch_plan(graph)
            with _AST_LOCK:
                generated = codegen.generate_source(graph, compute_fp16=bool(constants["COMPUTE_FP16"]))
                pruned = prune(generated, constants)
        except BuildError as e:
            raise BuildError(f"cannot build graph {graph.name!r} for target {spec.name!r}: {e}") from e
        source = f"# target {spec.name}, precision {precision}, {COMPILER_VERSION}, cache key {key}\n" + pruned
        code = _compile(source, path, spec)
        _write_entry(
            entry,
            source,
            code,
            {
                "payload_digest": digest,
                "target": spec.name,
                "target_spec": spec.digest(),
                "precision": precision,
                "compiler": COMPILER_VERSION,
                "graph": graph.name,
            },
            mac_key,
        )
        loaded = _remember(entry, source, code)
    run_fn = _instantiate(loaded.code, path, spec)
    seconds = time.perf_counter() - start
    logger.info(
        "built %s for %s (%s) in %.3fs%s", graph.name, spec.name, precision, seconds, " (cached)" if hit else ""
    )
    return CompiledModel(graph, spec, precision, key, loaded.source, path, seconds, hit, run_fn)


class _Loaded(NamedTuple):
    """A checked cache entry: its source, and that source compiled."""

    source: str
    code: types.CodeType


#: The entries this process built or checked, by folder (see the module docstring).
_MEMO: dict[str, _Loaded] = {}
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 64  # a daemon sees a handful of models and targets; bounded all the same
#: module.code header: format tag, this Python's bytecode magic, the MAC (see the module docstring).
#: Not a checked-hash .pyc (py_compile, PycInvalidationMode.CHECKED_HASH): a .pyc header holds
#: importlib.util.source_hash of the source, a fixed-key SipHash anyone can recompute, and nothing
#: binds the marshalled code after the header to that source, so a genuine header followed by other
#: code would pass its check and run. Here the MAC under the cache's own key covers the code bytes
#: themselves (with the entry and source digest). py_compile would also compile the source a second
#: time from the file (about 23 ms for ResNet-50's module) where build() already holds the code object.
_CODE_TAG = b"CUVLCODE"
_CODE_HEADER = len(_CODE_TAG) + len(importlib.util.MAGIC_NUMBER) + 32


def _mac_key(root: Path) -> bytes:
    """The cache folder ``root``, checked or created 0700, and its MAC key (made on first use).

    Raises:
        UnsafePathError: the folder or its key is not private (see the module docstring).
        BuildError: the folder or its key cannot be created.
    """
    try:
        private_dir.ensure_private_dir(root, what="build cache")
        return private_dir.load_or_create_key(root / KEY_FILE, what="build cache key")
    except OSError as e:
        raise BuildError(
            f"cannot create the build cache {root} or its key {root / KEY_FILE}: {e}; check cache_dir is writable"
        ) from e


def _source_parts(entry: Path, source: bytes) -> tuple[bytes, ...]:
    return b"cuvil-edge build module.py", entry.name.encode(), source


def _code_parts(entry: Path, source_sha: bytes, payload: bytes) -> tuple[bytes, ...]:
    return b"cuvil-edge build module.code", entry.name.encode(), importlib.util.MAGIC_NUMBER, source_sha, payload


def _remember(entry: Path, source: str, code: types.CodeType) -> _Loaded:
    loaded = _Loaded(source, code)
    with _MEMO_LOCK:
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))  # oldest first
        _MEMO[str(entry)] = loaded
    return loaded


def _load_entry(entry: Path, mac_key: bytes) -> _Loaded | None:
    """The entry's source and code if it is complete and authenticated, else None (a miss). The
    source is read and checked every time (0.2 ms for ResNet-50); its code comes from this
    process's memo when the memo holds that same source, else from module.code, else from
    compile() (and module.code is rewritten).

    Raises:
        UnsafePathError: the entry folder or one of its files is not private.
    """
    st = private_dir.lstat(entry)
    if st is None:
        return None
    private_dir.check(entry, st, what="build cache entry", directory=True)
    source = _read_cached(entry, mac_key)
    if source is None:
        return None
    with _MEMO_LOCK:
        known = _MEMO.get(str(entry))
    if known is not None and known.source == source:
        return known
    sha = hashlib.sha256(source.encode()).digest()
    path = entry / "module.py"
    code = _read_code(entry / "module.code", mac_key, sha, path)
    if code is None:
        try:
            code = _compile(source, path, None)
        except BuildError:
            logger.warning("cached module %s does not compile; rebuilding", path)
            return None
        try:
            atomic_write(entry / "module.code", _code_bytes(code, mac_key, entry, sha), mode=0o600)
        except OSError as e:  # a read-only cache still serves hits, compiling each time
            logger.warning("cannot rewrite %s: %s", entry / "module.code", e)
    return _remember(entry, source, code)


def _read_code(path: Path, mac_key: bytes, source_sha: bytes, source_path: Path) -> types.CodeType | None:
    """The code object in ``path`` if its header matches (tag, Python magic, the MAC of the entry,
    ``source_sha`` and the payload) and it was compiled from ``source_path``, else None.

    Raises:
        UnsafePathError: ``path`` is a link, another user's, or writable by group or others.
    """
    try:
        data = private_dir.read_private(path, what="build cache file")
    except OSError:
        return None
    if data is None:
        return None
    tag, magic = _CODE_TAG, importlib.util.MAGIC_NUMBER
    head, payload = data[:_CODE_HEADER], data[_CODE_HEADER:]
    if (
        len(head) != _CODE_HEADER
        or head[: len(tag)] != tag
        or head[len(tag) : len(tag) + len(magic)] != magic
        or not private_dir.mac_matches(mac_key, head[-32:], *_code_parts(path.parent, source_sha, payload))
    ):
        logger.warning(
            "%s is not authenticated for its source and this Python: not run, compiling the source again", path
        )
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(code, types.CodeType) or code.co_filename != str(source_path):
        return None  # moved cache folder: recompile so tracebacks name the file that is there
    return code


def _code_bytes(code: types.CodeType, mac_key: bytes, entry: Path, source_sha: bytes) -> bytes:
    payload = marshal.dumps(code)
    return (
        _CODE_TAG
        + importlib.util.MAGIC_NUMBER
        + private_dir.mac(mac_key, *_code_parts(entry, source_sha, payload))
        + payload
    )


def _compile(source: str, path: Path, spec: TargetSpec | None) -> types.CodeType:
    try:
        with _AST_LOCK:  # compile() builds an AST
            return compile(source, str(path), "exec")
    except Exception as e:
        where = f" for target {spec.name!r}" if spec is not None else ""
        raise BuildError(f"compiling the module{where} failed: {type(e).__name__}: {e} (source: {path})") from e


def _instantiate(code: types.CodeType, path: Path, spec: TargetSpec) -> Callable[..., dict]:
    """Run the module's code in a namespace of its own; its ``run``."""
    namespace: dict[str, Any] = {"__name__": f"cuvil_edge_built_{path.parent.name[:16]}"}
    try:
        exec(code, namespace)  # noqa: S102 - our own generated, pruned source, authenticated by the cache's MAC
    except Exception as e:
        raise BuildError(
            f"loading the module for target {spec.name!r} failed: {type(e).__name__}: {e} "
            f"(source: {path}); delete that cache entry and build again"
        ) from e
    built_for = namespace.get("BUILT_FOR", {})
    if not callable(namespace.get("run")) or built_for.get("target") != spec.name:
        raise BuildError(
            f"module {path} is not a build for target {spec.name!r} (BUILT_FOR={built_for!r}); "
            "delete that cache entry and build again"
        )
    return namespace["run"]


def _read_cached(entry: Path, mac_key: bytes) -> str | None:
    """The cached source if the entry is complete and its MAC verifies, else None.

    Raises:
        UnsafePathError: module.py or meta.json is a link, another user's, or group/other-writable.
    """
    try:
        meta_bytes = private_dir.read_private(entry / "meta.json", what="build cache file")
        source_bytes = private_dir.read_private(entry / "module.py", what="build cache file")
        if meta_bytes is None or source_bytes is None:
            return None
        meta = json.loads(meta_bytes.decode("utf-8"))
        source = source_bytes.decode("utf-8")
        stored = meta.get("source_mac") if isinstance(meta, dict) else None
        tag = bytes.fromhex(stored) if isinstance(stored, str) else None
    except (OSError, ValueError):
        return None
    if not private_dir.mac_matches(mac_key, tag, *_source_parts(entry, source_bytes)):
        logger.warning(
            "cache entry %s is not authenticated by %s (its module.py or meta.json was changed, or "
            "written by another cache): not run, rebuilding",
            entry,
            entry.parent / KEY_FILE,
        )
        return None
    return source


def _write_entry(entry: Path, source: str, code: types.CodeType, meta: dict[str, Any], mac_key: bytes) -> None:
    """module.py, module.code, then meta.json (whose presence and MAC make the entry a hit).

    Raises:
        UnsafePathError: the entry folder is a link, another user's, or group/other-writable.
        BuildError: the files cannot be written.
    """
    data = source.encode("utf-8")
    sha = hashlib.sha256(data)
    try:
        try:
            os.mkdir(entry, 0o700)
        except FileExistsError:
            pass
        private_dir.check(entry, os.lstat(entry), what="build cache entry", directory=True)
        atomic_write(entry / "module.py", data, mode=0o600)
        atomic_write(entry / "module.code", _code_bytes(code, mac_key, entry, sha.digest()), mode=0o600)
        meta = {
            **meta,
            "source_sha256": sha.hexdigest(),
            "source_mac": private_dir.mac(mac_key, *_source_parts(entry, data)).hex(),
        }
        text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
        atomic_write(entry / "meta.json", text.encode("utf-8"), mode=0o600)
    except OSError as e:
        raise BuildError(f"cannot write build cache entry {entry}: {e}; check cache_dir is writable") from e
