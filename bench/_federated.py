"""The federation's rounds in one process, for accuracy benchmarks (no Flower, no packages).

The same functions the Flower apps call: each site's ``agent.training.train_round`` (DP-SGD paid
from a real per-site ``PrivacyLedger``, or plain SGD), the noisy (correct, total) counts of its
local evaluation, claimed before they are computed as the ClientApp's evaluate does, FedAvg with
the sites' public weights, and the global model scored by the reference interpreter.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from cuvil_edge.agent.training import train_round
from cuvil_edge.config import SiteConfig
from cuvil_edge.datasets.records import Records
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.infer import with_initializers
from cuvil_edge.privacy import PrivacyLedger
from cuvil_edge.privacy.dpsgd import plan_dp_sgd
from cuvil_edge.privacy.ledger import dpsgd_epsilon
from cuvil_edge.privacy.counts import CountsMechanism
from cuvil_edge.privacy.release import reserve_release


@dataclass(frozen=True)
class Score:
    accuracy: float
    auc: float | None  # binary tasks only


def score(graph: Graph, test: Records) -> Score:
    out = interpreter.run(graph, {graph.inputs[0].name: test.x})[graph.outputs[0].name].astype(np.float64)
    accuracy = float((out.argmax(1) == test.y).mean())
    return Score(accuracy, auc(out[:, 1] - out[:, 0], test.y) if out.shape[1] == 2 else None)


def auc(scores: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for class 1 (Mann-Whitney U; ties count one half)."""
    pos, neg = scores[y == 1], scores[y == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


@lru_cache(maxsize=64)
def per_round_epsilon(sample_rate: float, local_epochs: int, batch_size: int, total: float, eval_eps: float,
                      rounds: int, delta: float) -> float:
    """Largest DP-SGD target ε per round (to 1/4096 of the budget, rounded down) whose ``rounds``
    rounds, RDP-composed with the noise the agent's plan picks for it, plus ``rounds`` evaluation
    releases of ``eval_eps`` fit ``total``."""
    budget = total - rounds * eval_eps

    def composed(e: float) -> float:
        p = plan_dp_sgd(target_epsilon=e, delta=delta, sample_rate=sample_rate, epochs=local_epochs,
                        expected_batch_size=batch_size)
        return dpsgd_epsilon([(p.noise_multiplier, p.sample_rate, p.steps)] * rounds, delta)

    lo, hi = budget / rounds, budget  # composing rounds is at least one round's ε
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if composed(mid) <= budget else (lo, mid)
    return lo


def with_budget(sites: Sequence[SiteConfig], total: float, rounds: int, delta: float = 1e-5,
                eval_share: float = 1 / 80) -> list[SiteConfig]:
    """``sites`` with their budget set to ``total`` per site: each evaluation release ``total *
    eval_share``, DP-SGD rounds the rest (:func:`per_round_epsilon`)."""
    out = []
    for site in sites:
        t, eval_eps = site.training, total * eval_share
        privacy = site.privacy.model_copy(update={
            "epsilon_budget": total, "delta": delta, "eval_epsilon": eval_eps,
            "epsilon_per_round": per_round_epsilon(t.sample_rate, t.local_epochs, t.batch_size, total, eval_eps,
                                                   rounds, delta)})
        out.append(site.model_copy(update={"privacy": privacy}))
    return out


def run_rounds(graph: Graph, sites: Sequence[SiteConfig], splits: Sequence[tuple[Records, Records]], test: Records,
               rounds: int, *, local_dp: bool = True, seed: int = 0) -> dict:
    """Train ``rounds`` FedAvg rounds; returns the global score after each and ε spent per site."""
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    history = []
    with tempfile.TemporaryDirectory() as tmp:
        ledgers = [PrivacyLedger(Path(tmp) / f"{s.site}.sqlite", site=s.site, epsilon_budget=s.privacy.epsilon_budget,
                                 delta=s.privacy.delta) for s in sites]
        for r in range(1, rounds + 1):
            model = with_initializers(graph, weights)
            updates = []
            for i, (site, (train, held), ledger) in enumerate(zip(sites, splits, ledgers)):
                out = train_round(model, site, train, ledger, r, r, seed=100_000 * seed + 100 * r + i,
                                  local_dp=local_dp)
                updates.append((site.training.weight, out.weights))
                pending = reserve_release(CountsMechanism(2, site.privacy.eval_epsilon), 2, ledger, key=f"eval-{r}",
                                          round=r)
                local = with_initializers(graph, out.weights)
                probs = interpreter.run(local, {local.inputs[0].name: held.x})[local.outputs[0].name]
                pending.publish(np.array([int((probs.argmax(1) == held.y).sum()), len(held.y)]))
            total = sum(n for n, _ in updates)
            weights = {k: sum(n * w[k] for n, w in updates) / total for k in weights}
            history.append(score(with_initializers(graph, weights), test))
        spent = {s.site: lg.spent() for s, lg in zip(sites, ledgers)}
        for lg in ledgers:
            lg.close()
    assert all(spent[s.site] <= s.privacy.epsilon_budget + 1e-9 for s in sites), spent
    return {"history": history, "final": history[-1], "spent": spent}
