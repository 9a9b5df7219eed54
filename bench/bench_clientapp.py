"""Per-message cost of the ClientApp on Flower's deployment engine, where every message gets a
process of its own: interpreter start, imports, verify, build, handle; and in a process forked from
the agent's warm task starter, as cuvil-edge's executor runs each message.

    .venv/bin/python bench/bench_clientapp.py [--repeats 5]

One enrolled device of the demo federation (sealed packages, as `cuvil-edge demo --deployment`).
Each message runs in a new process (tests/agent/one_message.py) with the next round's package (the
same model, new weights). "cold": the device's first message (empty build cache and data cache),
which is what every message cost before the build cache was keyed by the graph's structure and the
site's partition was kept; "warm": the third message (after one of the other kind, so an evaluation
reads a ledger holding a DP-SGD round). Medians over ``--repeats`` devices, cold and warm
measured side by side. Flower's own share (its process start and 3 s polling) is not in these
numbers; bench/bench_deployment.py times whole rounds. Results: bench/results/clientapp.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "tests" / "agent"))
from one_message import enrolled_device  # noqa: E402 - the harness the ClientApp test uses

from cuvil_edge.agent.app_gate import TaskStarter  # noqa: E402
FIELDS = ("process_s", "import_flwr_s", "import_clientapp_s", "handle_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    kinds = [f"{kind} {how}" for kind in ("evaluate", "train") for how in ("cold", "warm", "forked")]
    samples: dict[str, list[dict]] = {k: [] for k in kinds}
    starter = TaskStarter("127.0.0.1:1")  # the agent's: forks each message's process from a warm one
    starter.fork(platform.python_version).join()  # started (imports done) before anything is timed
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for kind, other in (("evaluate", "train"), ("train", "evaluate")):
                send, _ = enrolled_device(Path(tmp) / f"{kind}-{r}")  # a fresh device: kind, other, kind, kind
                samples[f"{kind} cold"].append(send(kind))
                send(other)
                samples[f"{kind} warm"].append(send(kind))
                samples[f"{kind} forked"].append(send(kind, starter))
    rows = {}
    for name, runs in samples.items():
        rows[name] = {f: round(statistics.median(s[f] for s in runs), 3) for f in FIELDS}
        rows[name]["heavy_modules"] = sorted({m for s in runs for m in s["heavy_modules"]})
    result = {"python": platform.python_version(), "machine": platform.machine(), "repeats": args.repeats,
              "medians": rows,
              "warm_over_cold_process": {k: round(rows[f"{k} warm"]["process_s"] / rows[f"{k} cold"]["process_s"], 3)
                                         for k in ("evaluate", "train")},
              "forked_over_warm_process": {k: round(rows[f"{k} forked"]["process_s"] / rows[f"{k} warm"]["process_s"],
                                                    3) for k in ("evaluate", "train")}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "clientapp.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# ClientApp cost per message (a process per message, as on the deployment engine)", "",
             f"`.venv/bin/python bench/bench_clientapp.py --repeats {args.repeats}`; medians in seconds; "
             "cold = a device's first message, warm = a later round (same model, new weights), forked = a "
             "later round in a process forked from the agent's warm task starter (agent/app_gate.py), as the "
             "agent runs its tasks.", "",
             "| message | process | import flwr | import ClientApp | handle | heavy modules imported |",
             "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['process_s']} | {row['import_flwr_s']} | {row['import_clientapp_s']} | "
                     f"{row['handle_s']} | {', '.join(row['heavy_modules']) or '-'} |")
    lines += ["", "warm / cold process time: " + ", ".join(f"{k} {v}" for k, v in
                                                             result["warm_over_cold_process"].items()),
              "forked / warm process time: " + ", ".join(f"{k} {v}" for k, v in
                                                         result["forked_over_warm_process"].items())]
    (RESULTS / "clientapp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
