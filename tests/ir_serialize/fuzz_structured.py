"""Structured fuzzer for package verification: typed errors everywhere.

Mutates the *graph* of a correctly signed package (node attributes, op names and
versions, node inputs/outputs, graph input/output types, inline tensor attributes,
initializer dtypes, shapes and values; see structured_mutations.py), re-encodes the
container with a consistent tensor table, re-signs it with test keys and verifies it.
The seed corpus is ONNX's own node test models imported through the frontend (as
given, with integer inputs as initializers, and with every input as an initializer),
plus conftest's MLP.

Acceptable outcomes: success, or a ``PackageError``.  Findings: any other exception, a
case over :data:`CASE_TIME_CAP_S`, or a MemoryError/RecursionError that build-time constant
folding swallowed (a blow-up its net hid; the CLI caps the address space so that memory
blow-ups show).  Rejections whose cause/context chain holds a non-``CuvilError`` exception
were caught by a broad safety net; they are counted as *netted* (with their root exception
and where it was raised) and are bugs to fix at the root.  Other exceptions that folding
gave up on are listed as ``folding_swallowed`` (for information: the graph fails at run time).
Case ``n`` of a run depends only on ``--seed`` and ``n`` (not on ``--jobs``), so ``--case n``
replays it with its traceback.

    .venv/bin/python tests/ir_serialize/fuzz_structured.py 1000000 --seed 7 --jobs 2
    .venv/bin/python tests/ir_serialize/fuzz_structured.py --seed 7 --case 1234   # replay one case

Exit status 1 when there are findings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from conftest import (EXPIRES, ISSUED, NOW, SITE, TARGET, cap_address_space, make_keys, make_trust,  # noqa: E402
                      mlp_graph)
from structured_mutations import mutate  # noqa: E402

from cuvil_edge.errors import CuvilError, PackageError  # noqa: E402
from cuvil_edge.ir_serialize import container  # noqa: E402
from cuvil_edge.ir_serialize.package import write_package  # noqa: E402
from cuvil_edge.ir_serialize.state import RollbackSnapshot, TrustState  # noqa: E402
from cuvil_edge.ir_serialize.verify import _check_package  # noqa: E402

KEYS = make_keys()
_ROOT, _ROOT_JSON = make_trust(KEYS)
#: A state trusting the test root with no floors. The fuzzer calls verify_and_accept's pure core
#: (every step, no state IO): through a durable state, the first accepted mutant would raise the
#: site's version floor and every later mutant would stop at the version check (step 8), before
#: the decoder and shape inference it is meant to reach.
TRUSTED = TrustState(_ROOT, json.loads(_ROOT_JSON), RollbackSnapshot(root_version=_ROOT.version))
MAX_PACKAGE_BYTES = 64 << 20


def check(data: bytes):
    """The entry point under test: verify one signed package (swap this to fuzz another reader)."""
    return _check_package(data, TRUSTED, site=SITE, target=TARGET, now=NOW, max_package_bytes=MAX_PACKAGE_BYTES)


CASE_TIME_CAP_S = 2.0
#: Seeds whose payload is larger than this are left out (hashing big tensors only slows the run).
MAX_SEED_PAYLOAD = 1 << 18
#: Inputs of at most this many elements become initializers in the "constant" seed variants.
MAX_CONST_INPUT = 4096


class CaseTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so library safety nets (``except Exception``) cannot swallow it."""


@dataclass(frozen=True)
class Seed:
    name: str
    graph_json: str
    arrays: dict[str, np.ndarray]


@dataclass
class Report:
    cases: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    writer_rejected: dict[str, int] = field(default_factory=dict)
    #: exceptions that build-time constant folding swallowed (shape_values.evaluate), by type
    folding_swallowed: dict[str, dict[str, Any]] = field(default_factory=dict)
    netted: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)
    seeds: int = 0
    seconds: float = 0.0
    slowest_s: float = 0.0
    slowest_case: str = ""

    @property
    def finding_count(self) -> int:
        return sum(f["count"] for f in self.findings.values())

    @property
    def netted_count(self) -> int:
        return sum(f["count"] for f in self.netted.values())

    def merge(self, other: "Report") -> None:
        self.cases += other.cases
        self.accepted += other.accepted
        for mine, theirs in ((self.rejected, other.rejected), (self.writer_rejected, other.writer_rejected)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        for mine, theirs in ((self.netted, other.netted), (self.findings, other.findings),
                             (self.folding_swallowed, other.folding_swallowed)):
            for k, v in theirs.items():
                if k in mine:
                    mine[k]["count"] += v["count"]
                else:
                    mine[k] = v
        if other.slowest_s > self.slowest_s:
            self.slowest_s, self.slowest_case = other.slowest_s, other.slowest_case

    def summary(self, examples: int = 20) -> dict[str, Any]:
        top = lambda d: dict(sorted(d.items(), key=lambda kv: -kv[1]["count"])[:examples])  # noqa: E731
        return {"cases": self.cases, "seeds": self.seeds, "seconds": round(self.seconds, 1), "accepted": self.accepted,
                "slowest_case_s": round(self.slowest_s, 4), "slowest_case": self.slowest_case,
                "rejected": dict(sorted(self.rejected.items(), key=lambda kv: -kv[1])),
                "writer_rejected": self.writer_rejected, "folding_swallowed": top(self.folding_swallowed),
                "netted_count": self.netted_count, "netted": top(self.netted),
                "finding_count": self.finding_count, "findings": top(self.findings)}


# --- corpus -------------------------------------------------------------------------


def _seed(name: str, graph) -> Seed | None:
    payload = container.encode_payload(graph)
    if len(payload) > MAX_SEED_PAYLOAD:
        return None
    header, _ = _split(payload)
    return Seed(name, json.dumps(json.loads(header)["graph"]), {k: graph.initializers[k] for k in sorted(graph.initializers)})


def _split(payload: bytes) -> tuple[bytes, bytes]:
    _, _, _, n = container.PRELUDE.unpack_from(payload, 0)
    return payload[container.PRELUDE.size:container.PRELUDE.size + n], payload[container.align(container.PRELUDE.size + n):]


def _as_initializers(model, inputs, keep) -> Any:
    """A copy of ``model`` whose graph inputs (with test data, ``keep(array)`` true) are initializers."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept, moved = [], []
    for vi, array in zip(model.graph.input, inputs):
        if isinstance(array, np.ndarray) and array.dtype != object and array.size <= MAX_CONST_INPUT and keep(array):
            moved.append(numpy_helper.from_array(array, vi.name))
        else:
            kept.append(vi)
    if not moved:
        return None
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(moved)
    return out


def onnx_seeds() -> list[Seed]:
    """ONNX node test models of the edge op set, imported three ways (skipping those that fail)."""
    # onnx is a dependency: if these imports fail, the fuzzer must fail, not quietly fuzz less.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
    from test_conformance_node import node_cases

    from cuvil_edge.frontend.onnx_import import load_model

    variants = {"": None, "+int-consts": lambda a: a.dtype.kind in "iub", "+all-consts": lambda a: True}
    seeds, seen = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, case in node_cases().items():
            if not case.data_sets:
                continue
            for suffix, keep in variants.items():
                model = case.model if keep is None else _as_initializers(case.model, case.data_sets[0][0], keep)
                if model is None:
                    continue
                try:
                    seed = _seed(name + suffix, load_model(model))
                except CuvilError:
                    continue
                if seed is not None and seed.graph_json not in seen:
                    seen.add(seed.graph_json)
                    seeds.append(seed)
    return seeds


def corpus() -> list[Seed]:
    return [_seed("mlp", mlp_graph())] + onnx_seeds()


# --- encoding -----------------------------------------------------------------------


def encode(graph: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """A container (PACKAGE_SPEC §5) for the (mutated) graph dict and arrays, with a
    consistent tensor table: sorted names, aligned regions, lengths and sha256."""
    entries, blobs, cursor = [], [], 0
    for name in sorted(arrays):
        a = arrays[name]
        blob = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
        entries.append({"name": name, "dtype": a.dtype.name, "shape": [int(d) for d in a.shape], "offset": cursor,
                        "length": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
        blobs.append(blob)
        cursor = container.align(cursor + len(blob))
    header = json.dumps({"format": container.FORMAT_VERSION, "graph": graph, "tensors": entries},
                        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    start = container.align(container.PRELUDE.size + len(header))
    out = bytearray(start + cursor)
    container.PRELUDE.pack_into(out, 0, container.MAGIC, container.FORMAT_VERSION, 0, len(header))
    out[container.PRELUDE.size:container.PRELUDE.size + len(header)] = header
    for entry, blob in zip(entries, blobs):
        out[start + entry["offset"]:start + entry["offset"] + entry["length"]] = blob
    return bytes(out)


def sign(payload: bytes) -> bytes:
    return write_package(None, SITE, TARGET, 5, KEYS["coordinator"], payload=payload, issued_at=ISSUED,
                         expires=EXPIRES, release_key=KEYS["release"], release_counter=3)


def make_case(seeds: list[Seed], seed: int, n: int) -> tuple[str, dict, dict, list[str]]:
    """Case ``n`` of run ``seed``: (seed name, graph dict, arrays, mutations); independent of --jobs."""
    rng = random.Random(f"{seed}:{n}")
    s = seeds[rng.randrange(len(seeds))]
    graph, arrays = json.loads(s.graph_json), dict(s.arrays)
    if rng.random() < 0.5:
        graph["initializers"] = sorted(arrays)
    steps = mutate(rng, graph, arrays)
    graph["initializers"] = sorted(arrays) if rng.random() < 0.995 else list(reversed(sorted(arrays)))
    return s.name, graph, arrays, steps


# --- running ------------------------------------------------------------------------


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and its causes/contexts as Python would print them."""
    out: list[BaseException] = []
    while e is not None and all(e is not x for x in out):
        out.append(e)
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    return out


def _where(e: BaseException) -> str:
    tb = e.__traceback__
    frames = traceback.extract_tb(tb) if tb is not None else []
    ours = [f for f in frames if "cuvil_edge" in f.filename] or frames
    if not ours:
        return "?"
    f = ours[-1]
    return f"{f.filename.split('cuvil_edge/')[-1]}:{f.lineno} {f.name}"


def _record(bucket: dict, key: str, example: str) -> None:
    if key in bucket:
        bucket[key]["count"] += 1
    else:
        bucket[key] = {"count": 1, "example": example[:400]}


def _alarm(signum, frame):
    raise CaseTimeout()


class _FoldingWatch(logging.Handler):
    """Counts the exceptions shape_values.evaluate logs (at DEBUG) when it gives up folding a node;
    a MemoryError or RecursionError there is a finding (a blow-up hidden by its net)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.report: Report | None = None
        self.label = ""

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        e = args[-1] if args else None
        if self.report is not None and isinstance(e, BaseException):
            op = str(args[0]).rsplit("(", 1)[-1].rstrip(")")
            key, example = f"{type(e).__name__} in {op} @ {_where(e)}", f"{self.label}: {type(e).__name__}: {e}"
            _record(self.report.folding_swallowed, key, example)
            if isinstance(e, (MemoryError, RecursionError)):  # a resource blow-up the net hid
                _record(self.report.findings, f"folding {key}", example)


_WATCH = _FoldingWatch()
_FOLD_LOG = logging.getLogger("cuvil_edge.ir.shape_values")


def run_case(report: Report, seeds: list[Seed], seed: int, n: int) -> None:
    name, graph, arrays, steps = make_case(seeds, seed, n)
    label = f"case {n} ({name}: {'; '.join(steps)})"
    _WATCH.label = label
    report.cases += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = sign(encode(graph, arrays))
    except PackageError as e:
        report.writer_rejected[type(e).__name__] = report.writer_rejected.get(type(e).__name__, 0) + 1
        return
    except Exception as e:  # noqa: BLE001 - the writer's own parse is the reader's code: also a finding
        _record(report.findings, f"writer {type(e).__name__} @ {_where(e)}", f"{label}: {e}")
        return
    t0 = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, CASE_TIME_CAP_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(data)
        report.accepted += 1
    except PackageError as e:
        kind = "<".join(type(x).__name__ for x in _chain(e))
        report.rejected[kind] = report.rejected.get(kind, 0) + 1
        foreign = [x for x in _chain(e) if not isinstance(x, CuvilError)]
        if foreign:
            root = foreign[-1]
            _record(report.netted, f"{type(root).__name__} @ {_where(root)}", f"{label}: {type(root).__name__}: {root}")
    except CaseTimeout:
        _record(report.findings, "timeout", f"{label}: over {CASE_TIME_CAP_S} s")
    except Exception as e:  # noqa: BLE001 - any other exception is a finding
        _record(report.findings, f"{type(e).__name__} @ {_where(e)}", f"{label}: {type(e).__name__}: {e}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    elapsed = time.perf_counter() - t0
    if elapsed > report.slowest_s:
        report.slowest_s, report.slowest_case = elapsed, label[:300]


_SEEDS: list[Seed] = []


def _worker(args: tuple[int, int, int, int, bool]) -> Report:
    cases, seed, worker, jobs, progress = args
    report, start = Report(), time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    _WATCH.report, level = report, _FOLD_LOG.level
    _FOLD_LOG.addHandler(_WATCH)
    _FOLD_LOG.setLevel(logging.DEBUG)
    try:
        for i, n in enumerate(range(worker, cases, jobs), 1):
            run_case(report, _SEEDS, seed, n)
            if progress and i % 50_000 == 0:
                print(f"worker {worker}: {i} cases, {time.perf_counter() - start:.0f} s, "
                      f"{report.finding_count} findings, {report.netted_count} netted", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGALRM, old)
        _FOLD_LOG.removeHandler(_WATCH)
        _FOLD_LOG.setLevel(level)
        _WATCH.report = None
    report.seconds = time.perf_counter() - start
    return report


def run(cases: int, seed: int = 7, *, jobs: int = 1, progress: bool = False) -> Report:
    """Run ``cases`` cases (case ``n`` is the same whatever ``jobs`` is) and merge the reports."""
    global _SEEDS
    _SEEDS = corpus()
    for s in _SEEDS:  # unmutated, every seed must verify (else the encoder, not the reader, is tested)
        check(sign(encode(json.loads(s.graph_json), dict(s.arrays))))
    start = time.perf_counter()
    args = [(cases, seed, w, jobs, progress) for w in range(jobs)]
    if jobs == 1:
        reports = [_worker(args[0])]
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            reports = pool.map(_worker, args)
    total = Report()
    for r in reports:
        total.merge(r)
    total.seconds, total.seeds = time.perf_counter() - start, len(_SEEDS)
    return total


def replay(seed: int, n: int) -> None:
    """Run case ``n`` alone and print its mutations and full traceback."""
    seeds = corpus()
    name, graph, arrays, steps = make_case(seeds, seed, n)
    print(f"seed graph {name}; mutations:", *steps, sep="\n  ")
    try:
        print("accepted:", check(sign(encode(graph, arrays))).graph.name)
    except Exception:  # noqa: BLE001 - show everything
        traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=int, nargs="?", default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--case", type=int, help="replay one case with its traceback")
    parser.add_argument("--max-memory-gib", type=float, default=4.0, help="address-space cap per process")
    args = parser.parse_args(argv)
    cap_address_space(args.max_memory_gib)
    if args.case is not None:
        replay(args.seed, args.case)
        return 0
    report = run(args.cases, args.seed, jobs=args.jobs, progress=True)
    print(json.dumps(report.summary(), indent=1))
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
