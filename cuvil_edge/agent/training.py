"""One round of local DP-SGD on the agent, paid for from the site's ledger first."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuvil_edge.config.site import SiteConfig
from cuvil_edge.datasets.digits import Split
from cuvil_edge.errors import BudgetExhaustedError, PrivacyError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.privacy import PrivacyLedger


@dataclass(frozen=True)
class TrainOutcome:
    weights: dict[str, np.ndarray]  # every float32 initializer, trained ones updated
    epsilon_round: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    loss: float


def train_round(graph: Graph, site: SiteConfig, data: Split, ledger: PrivacyLedger,
                server_round: int, package_version: int, seed: int | None = None) -> TrainOutcome:
    """Reserve this round's DP-SGD spend, then train the graph's weights on ``data``.

    Raises:
        BudgetExhaustedError: the round would take the site over its budget
            (nothing was reserved or trained).
        PrivacyError: the data or hyperparameters cannot give the target ε.
    """
    from cuvil_edge.agent.torch_model import IRTorchModule
    from cuvil_edge.privacy.dpsgd import plan_dp_sgd, train_dp_sgd

    p, t = site.privacy, site.training
    n = len(data.y)
    if n < t.batch_size:
        raise PrivacyError(f"site {site.site} has {n} examples, fewer than batch_size {t.batch_size}; lower it")
    plan = plan_dp_sgd(n, target_epsilon=p.epsilon_per_round, delta=p.delta, epochs=t.local_epochs,
                       batch_size=t.batch_size)
    sigma, sample_rate, steps = plan.noise_multiplier, plan.sample_rate, plan.steps
    exceeds, total = ledger.would_exceed_dpsgd(sigma, sample_rate, steps)
    if exceeds:
        raise BudgetExhaustedError(
            f"site {site.site}: round {server_round} would bring ε to {total:.3f}, over the budget "
            f"{p.epsilon_budget}; the site sits this round out"
        )
    reservation = ledger.reserve_dpsgd(sigma, sample_rate, steps, key=f"train-v{package_version}",
                                       round=server_round)
    model = IRTorchModule(graph)
    result = train_dp_sgd(model, data.x, data.y, target_epsilon=p.epsilon_per_round, delta=p.delta,
                          epochs=t.local_epochs, batch_size=t.batch_size, lr=t.learning_rate,
                          momentum=t.momentum, max_grad_norm=t.max_grad_norm, seed=seed)
    if abs(result.noise_multiplier - sigma) > 1e-9 * max(1.0, sigma) or result.steps > steps:
        # Never release a model trained with less noise than the ledger paid for.
        raise PrivacyError(
            f"Opacus chose σ={result.noise_multiplier}, steps={result.steps}; the ledger reserved σ={sigma}, "
            f"steps={steps}. Refusing to release the update."
        )
    ledger.commit(reservation)
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    weights.update(model.ir_weights())
    return TrainOutcome(weights, result.epsilon, sigma, sample_rate, steps, result.final_loss)
