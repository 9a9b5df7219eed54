"""Depthwise + pointwise fusion on and off, against onnxruntime, one thread, interleaved.

For each model (default MobileNetV2 and EfficientNet-B0, bench/compiled_models.py) two compiled
modules are built for x86-64 from the same export: the default pipeline (FuseDepthwisePointwise
included) and the same pipeline without it. The two and an onnxruntime session are timed
round-robin in one process at batch 1 (bench_compiled's sampling), so the machine's noise hits all
three alike; printed and written to bench/results/fused_blocks.json.

    .venv/bin/python bench/bench_fused_blocks.py [--models mobilenetv2,efficientnet] [--samples 21]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _clean_env import reexec_without_openblas_env  # noqa: E402

if __name__ == "__main__":
    reexec_without_openblas_env(__file__)

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import bench_compiled as bc  # noqa: E402
import compiled_models as cm  # noqa: E402
from cuvil_edge.device_targets import build  # noqa: E402
from cuvil_edge.frontend import load_model  # noqa: E402
from cuvil_edge.passes import FuseDepthwisePointwise, default_passes, optimize  # noqa: E402


def bench(name: str, samples: int, cache: Path) -> dict:
    data, input_name = bc.export(name, cm.make(name))
    graph = load_model(data)
    fused, _ = optimize(graph)
    plain, _ = optimize(graph, [p for p in default_passes() if not isinstance(p, FuseDepthwisePointwise)])
    x = cm.example(name, 1)
    feeds = {input_name: x}
    on = build(bc._Package(fused, data + b"on"), "x86-64", cache_dir=cache / "on")
    off = build(bc._Package(plain, data + b"off"), "x86-64", cache_dir=cache / "off")
    session = bc.ort_session(data)
    want = session.run(None, feeds)[0]
    err = {k: float(np.abs(next(iter(m.run(feeds).values())) - want).max() / np.abs(want).max())
           for k, m in (("fused", on), ("unfused", off))}
    times = bc.time_interleaved({"fused": lambda: on.run(feeds), "unfused": lambda: off.run(feeds),
                                 "onnxruntime": lambda: session.run(None, feeds)}, samples)
    nodes = {"fused": len(fused.nodes), "unfused": len(plain.nodes),
             "CuvilDwPw": sum(n.op_type == "CuvilDwPw" for n in fused.nodes)}
    return {"model": cm.SPECS[name].title, "times": times, "rel_err": err, "nodes": nodes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mobilenetv2,efficientnet")
    parser.add_argument("--samples", type=int, default=21)
    args = parser.parse_args()
    out = {"machine": bc.machine_note(), "samples": args.samples, "models": []}
    with threadpool_limits(1), tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            r = bench(name, args.samples, Path(folder))
            out["models"].append(r)
            t = r["times"]
            ort_ms = t["onnxruntime"]["ms"]
            print(f"{r['model']}: nodes {r['nodes']}; ms fused {t['fused']['ms']:.3f} unfused {t['unfused']['ms']:.3f} "
                  f"onnxruntime {ort_ms:.3f}; /ORT fused {t['fused']['ms'] / ort_ms:.2f}x unfused "
                  f"{t['unfused']['ms'] / ort_ms:.2f}x; of minima fused "
                  f"{t['fused']['min_ms'] / t['onnxruntime']['min_ms']:.2f}x unfused "
                  f"{t['unfused']['min_ms'] / t['onnxruntime']['min_ms']:.2f}x; rel err {r['rel_err']}")
    Path(__file__).with_name("results").joinpath("fused_blocks.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
