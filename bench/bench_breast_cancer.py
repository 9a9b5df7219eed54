"""The breast-cancer example under local DP: accuracy and AUC at per-site ε ∈ {1, 2, 4, 8}, next to
non-private federated and centralised training.

    .venv/bin/python bench/bench_breast_cancer.py                  # writes bench/results/breast_cancer.{md,json}
    .venv/bin/python bench/bench_breast_cancer.py --eps 8 --seeds 1 --no-write --lr 0.5   # a sweep point

The example's own files: configs/examples/breast-cancer (three hospitals' CSVs, split non-IID, the
coordinator's test.csv, the torch-exported MLP and the site YAMLs' hyperparameters). The rounds run
in one process (bench/_federated.py: the agents' train_round, noisy evaluation releases, FedAvg);
ε is each hospital's total over all rounds, DP-SGD and evaluation releases together, checked by a
real ledger. "Centralised" trains the same model with the same hyperparameters on the three
hospitals' training records pooled in one site (what the federation replaces).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _federated import run_rounds, with_budget  # noqa: E402

from cuvil_edge.config import load_federation  # noqa: E402
from cuvil_edge.coordinator.model import load_federation_model  # noqa: E402
from cuvil_edge.datasets.records import Records  # noqa: E402
from cuvil_edge.datasets.site_files import load_records, load_site_data  # noqa: E402

EXAMPLE = ROOT / "configs" / "examples" / "breast-cancer" / "federation.yaml"
RESULTS = ROOT / "bench" / "results"


def pooled(splits):
    train = Records(np.concatenate([t.x for t, _ in splits]), np.concatenate([t.y for t, _ in splits]))
    held = Records(np.concatenate([h.x for _, h in splits]), np.concatenate([h.y for _, h in splits]))
    return [(train, held)]


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, help="default: the federation file's")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--no-baselines", action="store_true", help="only the private federated runs")
    for name in ("local_epochs", "batch_size", "sample_rate", "learning_rate", "max_grad_norm"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, dest=name)
    args = parser.parse_args()
    torch.set_num_threads(1)
    federation = load_federation(EXAMPLE)
    rounds = args.rounds or federation.rounds
    overrides = {k: (int(v) if k in ("local_epochs", "batch_size") else v) for k in
                 ("local_epochs", "batch_size", "sample_rate", "learning_rate", "max_grad_norm")
                 if (v := getattr(args, k)) is not None}
    sites = [s.model_copy(update={"training": s.training.model_copy(update=overrides)})
             for s in federation.load_sites()]
    graph = load_federation_model(federation.model)
    splits = [load_site_data(s.data, graph) for s in sites]
    test = load_records(federation.dataset.test, graph)
    central_site = sites[0].model_copy(update={"site": "pooled", "training": sites[0].training.model_copy(
        update={"sample_rate": min(1.0, sites[0].training.sample_rate * len(splits[0][0].y)
                                   / sum(len(t.y) for t, _ in splits))})})  # the same expected batch
    setups = [(f"federated, local DP ε={e:g}", "federated", e, sites, splits) for e in args.eps]
    if not args.no_baselines:
        setups += [("federated, non-private", "federated", None, sites, splits),
                   ("centralised, non-private", "centralised", None, [central_site], pooled(splits))]
        setups += [(f"centralised, DP ε={e:g}", "centralised", e, [central_site], pooled(splits)) for e in args.eps]
    rows, runs, start = [], [], time.perf_counter()
    for label, kind, eps, members, data in setups:
        scores = []
        for seed in range(args.seeds):
            configured = with_budget(members, eps, rounds) if eps is not None else members
            t0 = time.perf_counter()
            out = run_rounds(graph, configured, data, test, rounds, local_dp=eps is not None, seed=seed)
            scores.append(out["final"])
            runs.append({"setup": label, "seed": seed, "accuracy_by_round": [s.accuracy for s in out["history"]],
                         "auc_by_round": [s.auc for s in out["history"]], "spent": out["spent"],
                         "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{label} seed {seed}: accuracy {out['final'].accuracy:.4f} AUC {out['final'].auc:.4f} "
                  f"spent {({k: round(v, 3) for k, v in out['spent'].items()})}", flush=True)
        acc, aucs = [s.accuracy for s in scores], [s.auc for s in scores]
        rows.append({"setup": label, "kind": kind, "epsilon": eps, "accuracy": statistics.mean(acc),
                     "accuracy_min": min(acc), "accuracy_max": max(acc), "auc": statistics.mean(aucs),
                     "auc_min": min(aucs), "auc_max": max(aucs), "n": len(scores)})
    t = sites[0].training
    lines = ["# Breast-cancer example: accuracy and AUC under local DP", "",
             f"Command: `.venv/bin/python bench/bench_breast_cancer.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`"
             f"  ", f"Machine: {platform.platform()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"{time.perf_counter() - start:.0f} s.", "",
             f"configs/examples/breast-cancer: 3 hospitals ({', '.join(f'{s.site} {len(d[0].y)}+{len(d[1].y)}' for s, d in zip(sites, splits))} "
             f"train+local-eval records, non-IID), {len(test.y)} test records held by the coordinator; "
             f"{rounds} rounds, δ = 1e-5, {args.seeds} seeds (DP-SGD and sampling randomness; same initial model). "
             "ε is each site's total: DP-SGD rounds composed by RDP plus one noisy-count evaluation release "
             "of ε/80 per round.", "",
             f"Hyperparameters (every hospital): local_epochs {t.local_epochs}, batch_size {t.batch_size}, "
             f"sample_rate {t.sample_rate}, learning_rate {t.learning_rate}, max_grad_norm {t.max_grad_norm}"
             + (f" (overridden: {overrides})" if overrides else " (the site YAMLs)") + ".", "",
             "| setup | accuracy (mean) | min | max | AUC (mean) | min | max |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['setup']} | {r['accuracy']:.4f} | {r['accuracy_min']:.4f} | {r['accuracy_max']:.4f} | "
              f"{r['auc']:.4f} | {r['auc_min']:.4f} | {r['auc_max']:.4f} |" for r in rows]
    print("\n".join(lines))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "breast_cancer.md").write_text("\n".join(lines) + "\n")
        (RESULTS / "breast_cancer.json").write_text(json.dumps({"rows": rows, "runs": runs, "overrides": overrides,
                                                                "rounds": rounds}, indent=2) + "\n")


if __name__ == "__main__":
    main()
