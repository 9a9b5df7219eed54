"""What the compiled module saves by writing the shapes the build evaluated as literals of the
input sizes, on the library-style shape patterns (tests/architectures/shape_patterns.py), each
exported with a dynamic batch and a dynamic sequence or image size.

    .venv/bin/python bench/bench_symbolic_shapes.py     # writes bench/results/symbolic_shapes.{json,md}

For each pattern, side by side in one process, one thread, batch 1 at the smaller test size:
the module as built (shape vectors as literals, their subgraphs not written) and the same graph's
module with every shape node run as a kernel call (the codegen before symbolic shape literals),
and onnxruntime. Reported: kernel calls per forward, median µs per call, and the ratios. The
script unsets OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for itself (bench/_clean_env.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _clean_env import reexec_without_openblas_env, removed  # noqa: E402

reexec_without_openblas_env(__file__)

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from unittest import mock  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "architectures"))
import test_symbolic_shapes as patterns  # noqa: E402
from cuvil_edge.device_targets import build, shape_code  # noqa: E402
from cuvil_edge.frontend import load_model  # noqa: E402
from cuvil_edge.passes import optimize  # noqa: E402

REPEAT, ROUNDS = 200, 5


def _no_literals(graph):
    """The plan of a module that runs every node (what codegen wrote before shape literals)."""
    return shape_code.ShapeCode({}, {}, frozenset(range(len(graph.nodes))))


_CALL = re.compile(r"^\s+[\w, ]+ = (?!np\.array\()[A-Za-z_][\w.]*\(")


def _calls(source: str) -> int:
    """Kernel calls in the module's forward (shape literals, ``np.array([...])``, are not calls)."""
    forward = source[source.index("def _forward"):].split("\ndef ")[0]
    return sum(1 for line in forward.splitlines() if _CALL.match(line))


def _median_us(fn) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6


def measure(name: str, cache: Path) -> dict:
    data = patterns.exported(name)
    graph, _ = optimize(load_model(data))
    package = SimpleNamespace(graph=graph, payload_digest=hashlib.sha256(data).hexdigest())
    literal = build(package, "x86-64", cache_dir=cache / "literal")
    with mock.patch.object(shape_code, "plan", _no_literals):
        kernels = build(package, "x86-64", cache_dir=cache / "kernels")
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    feeds = patterns.feeds_for(name, 1, patterns.CASES[name].sizes[0], 0)
    want = session.run(None, feeds)[0]
    for module in (literal, kernels):
        np.testing.assert_allclose(next(iter(module.run(feeds).values())), want, rtol=1e-4, atol=1e-5)
    runs = {"literal": [], "kernels": [], "onnxruntime": []}
    for _ in range(ROUNDS):  # interleaved, so drift on a shared machine hits all three alike
        runs["literal"].append(_median_us(lambda: literal.run(feeds)))
        runs["kernels"].append(_median_us(lambda: kernels.run(feeds)))
        runs["onnxruntime"].append(_median_us(lambda: session.run(None, feeds)))
    us = {k: float(np.median(v)) for k, v in runs.items()}
    return {"model": name, "size": [int(v) for v in np.atleast_1d(patterns.CASES[name].sizes[0])],
            "calls_literal": _calls(literal.source), "calls_kernels": _calls(kernels.source),
            "us_literal": round(us["literal"], 1), "us_kernels": round(us["kernels"], 1),
            "us_onnxruntime": round(us["onnxruntime"], 1),
            "literal_over_kernels": round(us["literal"] / us["kernels"], 3),
            "literal_over_onnxruntime": round(us["literal"] / us["onnxruntime"], 3)}


def main() -> None:
    with threadpool_limits(1), tempfile.TemporaryDirectory() as tmp:
        rows = [measure(name, Path(tmp)) for name in patterns.CASES]
    meta = {"python": platform.python_version(), "machine": platform.machine(), "removed_env": removed(),
            "repeat": REPEAT, "rounds": ROUNDS, "batch": 1, "threads": 1}
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "symbolic_shapes.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["# Shape literals in the compiled module", "",
             "Command: `.venv/bin/python bench/bench_symbolic_shapes.py` (one thread, batch 1, median µs of "
             f"{REPEAT} calls, median of {ROUNDS} interleaved rounds; OPENBLAS_CORETYPE/L2_SIZE unset: "
             f"{meta['removed_env'] or 'none were set'}).", "",
             "| model | size | kernel calls per forward (literals / all nodes) | µs literals | µs all nodes | literals / all nodes "
             "| µs onnxruntime | literals / onnxruntime |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['size']} | {r['calls_literal']} / {r['calls_kernels']} | {r['us_literal']} | "
                     f"{r['us_kernels']} | {r['literal_over_kernels']} | {r['us_onnxruntime']} | "
                     f"{r['literal_over_onnxruntime']} |")
    (out / "symbolic_shapes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
