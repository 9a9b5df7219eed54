"""Global test accuracy of the digits demo under local DP-SGD, per-site total ε ∈ {1, 2, 4, 8}.

The demo pipeline without Flower (the same functions the Flower apps call, in one
process): 3 non-IID sites (the demo's Dirichlet split and site YAMLs), the federation's
rounds of ``agent.training.train_round`` (DP-SGD paid from a real per-site ``PrivacyLedger``)
+ the noisy (correct, total) counts of each site's local evaluation (claimed before
they are computed, as the ClientApp's evaluate does) + FedAvg with the sites' public
weights, and the global model scored by the reference interpreter on the held-out
global test set.

Budget per site and total ε: one evaluation release per round of ε·share/rounds
(``--eval-share``, default 1/8: the site YAMLs' 20 x 0.05 at ε = 8), and ``epsilon_per_round``
calibrated (bisection, from the public plan: sample rate, epochs) so that all the rounds'
DP-SGD events and evaluation releases compose, exactly as the site's ledger composes them
(min of RDP and basic composition at δ = 1e-5), to at most ε. The ledger checks the total never exceeds ε.
Repetitions differ in model initialisation and DP-SGD seeds.

    .venv/bin/python bench/bench_dp_accuracy.py --eps 8 4 2 1 --reps 5 --server-momentum 0.5   # the table
    .venv/bin/python bench/bench_dp_accuracy.py --eps 8 --reps 1
    .venv/bin/python bench/bench_dp_accuracy.py --eps 8 --no-write --local-epochs 10 --lr 0.15   # a sweep point
    .venv/bin/python bench/bench_dp_accuracy.py --jobs 2 ...   # independent runs in 2 processes

The DP-SGD hyperparameters come from configs/sites/*.yaml unless overridden
(--local-epochs, --lr, --batch, --sample-rate, --clip, --momentum, applied to every site), the
rounds from configs/federation.yaml (--rounds); --activation/--channels swap the builtin
model for a variant and --server-momentum/--server-lr replace FedAvg by FedAvgM (a
post-processing of the released updates). The ε accounting and data split are the same either way.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cuvil_edge.agent.training import train_round
from cuvil_edge.config import load_federation
from cuvil_edge.coordinator.model import load_federation_model
from cuvil_edge.coordinator.packaging import with_initializers
from cuvil_edge.datasets import digits
from cuvil_edge.datasets.split import PUBLIC_SPLIT_KEY, split_records
from cuvil_edge.ir import interpreter
from cuvil_edge.privacy import PrivacyLedger
from cuvil_edge.privacy.dpsgd import plan_dp_sgd
from cuvil_edge.privacy.counts import CountsMechanism
from cuvil_edge.privacy.release import reserve_release
from cuvil_edge.privacy.accounting import Accountant, DpSgd, PureDp

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DELTA = 1e-5


@functools.lru_cache(maxsize=None)
def calibrate(sample_rate: float, total: float, eval_eps: float, epochs: int, batch: int,
              rounds: int) -> tuple[float, float]:
    """Largest per-round DP-SGD target whose ``rounds`` rounds + ``rounds`` evaluation releases
    fit ``total`` as the ledger composes them (min of RDP and basic composition, at δ)."""

    def composed(e: float) -> float:
        p = plan_dp_sgd(target_epsilon=e, delta=DELTA, sample_rate=sample_rate, epochs=epochs,
                        expected_batch_size=batch)
        events = [DpSgd(p.noise_multiplier, p.sample_rate, p.steps), PureDp(eval_eps)] * rounds
        return Accountant(events).epsilon(DELTA)

    lo, hi = total / (4 * rounds), total  # one round's ε is at most the total
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if composed(mid) <= total else (lo, mid)
    return lo, composed(lo)


def run_once(total: float, rep: int, federation, sites, splits, test, opts: dict) -> dict:
    rounds = opts["rounds"]
    graph = _model(federation, federation.seed + rep, opts)
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    velocity = {k: np.zeros_like(v) for k, v in weights.items()}
    eval_eps = total * opts["eval_share"] / rounds
    configs, planned = [], {}
    for site, (train, _) in zip(sites, splits):
        t = site.training
        per_round, composed = calibrate(t.sample_rate, total, eval_eps, t.local_epochs, t.batch_size, rounds)
        privacy = site.privacy.model_copy(update={"epsilon_budget": total, "epsilon_per_round": per_round,
                                                  "eval_epsilon": eval_eps, "delta": DELTA})
        configs.append(site.model_copy(update={"privacy": privacy}))
        planned[site.site] = {"epsilon_per_round": round(per_round, 4), "eval_epsilon": round(eval_eps, 5),
                              "planned_total": round(composed, 4)}
    accuracies = []
    with tempfile.TemporaryDirectory() as tmp:
        ledgers = [PrivacyLedger(Path(tmp) / f"{s.site}.sqlite", site=s.site, epsilon_budget=total, delta=DELTA)
                   for s in configs]
        for r in range(1, rounds + 1):
            model = with_initializers(graph, weights)
            updates = []
            for i, (site, (train, held), ledger) in enumerate(zip(configs, splits, ledgers)):
                out = train_round(model, site, train, ledger, r, r, seed=100_000 * rep + 100 * r + i)
                updates.append((site.training.weight, out.weights))
                pending = reserve_release(CountsMechanism(2, eval_eps), 2, ledger, key=f"eval-{r}", round=r)
                local = with_initializers(graph, out.weights)
                probs = interpreter.run(local, {local.inputs[0].name: held.x})[local.outputs[0].name]
                pending.publish(np.array([int((probs.argmax(1) == held.y).sum()), len(held.y)]))
            n_all = sum(n for n, _ in updates)
            average = {k: sum(n * w[k] for n, w in updates) / n_all for k in weights}
            # FedAvgM (Hsu et al. 2019, as Flower's FedAvgM): post-processing of the released updates
            for k in weights:
                velocity[k] = opts["server_momentum"] * velocity[k] + (average[k] - weights[k])
                weights[k] = (weights[k] + opts["server_lr"] * velocity[k]).astype(np.float32)
            model = with_initializers(graph, weights)
            probs = interpreter.run(model, {model.inputs[0].name: test.x})[model.outputs[0].name]
            accuracies.append(float((probs.argmax(1) == test.y).mean()))
        spent = {s.site: round(lg.spent(), 4) for s, lg in zip(configs, ledgers)}
        for lg in ledgers:
            lg.close()
    assert all(v <= total + 1e-9 for v in spent.values()), spent
    return {"epsilon": total, "rep": rep, "accuracy_by_round": accuracies, "final_accuracy": accuracies[-1],
            "spent": spent, "plan": planned}


def _model(federation, seed: int, opts: dict):
    """The federation's model, or the builtin digits CNN with the command line's variant."""
    if opts["activation"] is None and opts["channels"] is None:
        return load_federation_model(federation.model, seed)
    from cuvil_edge.frontend import load_model
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx

    variant = {k: v for k, v in (("activation", opts["activation"]), ("channels", opts["channels"])) if v}
    return load_model(digits_cnn_onnx(seed, **variant))


def _timed(eps: float, rep: int, federation, sites, splits, test, opts: dict) -> tuple[dict, float]:
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    return run_once(eps, rep, federation, sites, splits, test, opts), time.perf_counter() - t0


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--federation", type=Path, default=ROOT / "configs" / "federation.yaml")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel worker processes")
    parser.add_argument("--local-epochs", type=int, help="override every site's training.local_epochs")
    parser.add_argument("--lr", type=float, help="override training.learning_rate")
    parser.add_argument("--batch", type=int, help="override training.batch_size")
    parser.add_argument("--clip", type=float, help="override training.max_grad_norm (DP-SGD L2 clip)")
    parser.add_argument("--momentum", type=float, help="override training.momentum")
    parser.add_argument("--sample-rate", type=float, help="override training.sample_rate (Poisson rate)")
    parser.add_argument("--rounds", type=int, help="federated rounds (default: the federation's rounds)")
    parser.add_argument("--eval-share", type=float, default=1 / 8,
                        help="share of ε given to the evaluation releases (split evenly over the rounds)")
    parser.add_argument("--server-momentum", type=float, default=0.0, help="FedAvgM server momentum β")
    parser.add_argument("--server-lr", type=float, default=1.0, help="FedAvgM server learning rate η")
    parser.add_argument("--activation", choices=["Relu", "Tanh"], help="builtin model's activation")
    parser.add_argument("--channels", type=int, help="builtin model's conv channels")
    parser.add_argument("--first-rep", type=int, default=0, help="first repetition (seed) to run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    federation = load_federation(args.federation)
    overrides = {k: v for k, v in {"local_epochs": args.local_epochs, "learning_rate": args.lr,
                                   "batch_size": args.batch, "max_grad_norm": args.clip,
                                   "momentum": args.momentum, "sample_rate": args.sample_rate}.items()
                 if v is not None}
    opts = {"rounds": args.rounds or federation.rounds, "eval_share": args.eval_share,
            "server_momentum": args.server_momentum, "server_lr": args.server_lr,
            "activation": args.activation, "channels": args.channels}
    sites = [s.model_copy(update={"training": s.training.model_copy(update=overrides)})
             for s in federation.load_sites()]
    if overrides:
        print(f"training overrides (all sites): {overrides}", flush=True)
    d = federation.dataset
    splits = [split_records(digits.site_partition(i, len(sites), test_fraction=d.test_fraction,
                                                 alpha=d.dirichlet_alpha, seed=d.seed),
                            s.data.eval_fraction, key=PUBLIC_SPLIT_KEY) for i, s in enumerate(sites)]
    test = digits.global_test(d.test_fraction)
    runs, start = [], time.perf_counter()
    jobs = [(eps, rep) for eps in args.eps for rep in range(args.first_rep, args.first_rep + args.reps)]

    def show(run: dict, seconds: float) -> None:
        print(f"ε={run['epsilon']:g} rep {run['rep']}: accuracy {run['final_accuracy']:.4f} "
              f"(rounds {', '.join(f'{a:.3f}' for a in run['accuracy_by_round'])}) "
              f"spent {run['spent']} [{seconds:.0f} s]", flush=True)

    if args.jobs > 1:  # independent runs in worker processes (fork), one torch thread each
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_timed, eps, rep, federation, sites, splits, test, opts) for eps, rep in jobs]
            for future in futures:
                run, seconds = future.result()
                runs.append(run)
                show(run, seconds)
    else:
        for eps, rep in jobs:
            run, seconds = _timed(eps, rep, federation, sites, splits, test, opts)
            runs.append(run)
            show(run, seconds)
    table = []
    for eps in sorted(args.eps):
        acc = [r["final_accuracy"] for r in runs if r["epsilon"] == eps]
        table.append({"epsilon": eps, "mean": statistics.mean(acc), "min": min(acc), "max": max(acc), "n": len(acc)})
    model = {k: opts[k] for k in ("activation", "channels") if opts[k]} or "federation's model"
    server = (f"FedAvgM server momentum {opts['server_momentum']:g}, server lr {opts['server_lr']:g}"
              if opts["server_momentum"] or opts["server_lr"] != 1 else "FedAvg")
    result = {"setup": {"sites": [s.site for s in sites], "train_examples": [len(t.y) for t, _ in splits],
                        "rounds": opts["rounds"], "delta": DELTA, "repetitions": args.reps,
                        "eval_epsilon": f"ε·{opts['eval_share']:g}/{opts['rounds']} per release, one per round",
                        "model": model, "aggregation": server, "command": "python " + " ".join(sys.argv),
                        "path": "no Flower: train_round + noisy evaluation counts + FedAvg with public weights "
                        "+ interpreter", "training": {s.site: s.training.model_dump() for s in sites},
                        "training_overrides": overrides, "machine": platform.platform(),
                        "seconds": round(time.perf_counter() - start, 1)},
              "table": table, "runs": runs}
    lines = ["# Global test accuracy under local DP-SGD (digits demo)", "",
             f"3 non-IID sites, {opts['rounds']} rounds, δ = {DELTA:g}, {args.reps} repetitions (seeds "
             f"{args.first_rep}..{args.first_rep + args.reps - 1}); ε is each site's total as its ledger composes it "
             f"(min of the pessimistic PLD total and basic composition): DP-SGD plus one noisy-count evaluation release per round of "
             f"ε·{opts['eval_share']:g}/{opts['rounds']}, the DP-SGD share calibrated so the total fits ε.",
             "Produced by `bench/bench_dp_accuracy.py` (the demo's functions without Flower):", "",
             f"    {result['setup']['command']}", "",
             "DP-SGD hyperparameters (every site): " + ", ".join(
                 f"{k} {v}" for k, v in sites[0].training.model_dump().items())
             + (f" (overridden on the command line: {overrides}; configs/sites/*.yaml unchanged)" if overrides
                else " (configs/sites/*.yaml)") + f". Model: {model}. Aggregation: {server}.", "",
             "| per-site ε | mean accuracy | min | max | seeds |", "|---|---|---|---|---|"]
    lines += [f"| {t['epsilon']:g} | {t['mean']:.4f} | {t['min']:.4f} | {t['max']:.4f} | {t['n']} |" for t in table]
    lines += ["", "Reference: centralised DP-SGD 0.951 at ε = 8, 0.919 at ε = 2; non-private 0.977."]
    print("\n".join(lines))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "dp_accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
        md = RESULTS / "dp_accuracy.md"
        kept = md.read_text().split("\n## ", 1) if md.exists() else []  # the sweep sections stay
        tail = "\n## " + kept[1] if len(kept) == 2 else ""
        md.write_text("\n".join(lines) + "\n" + tail)


if __name__ == "__main__":
    main()
