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
                server_round: int, package_version: int, seed: int | None = None,
                local_dp: bool = True) -> TrainOutcome:
    """Reserve this round's DP-SGD spend, then train the graph's weights on ``data``.

    Before anything is reserved or trained, the σ for the per-round target ε is
    planned and the ledger asked whether (σ, q, steps) composed with everything
    spent so far stays within the site's budget. With ``local_dp=False``
    (federation ``local_dp: false``, e.g. central DP only) the round trains with
    plain SGD, spends nothing and returns ``epsilon_round`` 0: the update itself
    then carries no record-level guarantee.

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
    if not local_dp:
        return _train_plain(graph, site, data, seed)
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


def _train_plain(graph: Graph, site: SiteConfig, data: Split, seed: int | None) -> TrainOutcome:
    """Non-private minibatch SGD with the site's hyperparameters (no ledger spend)."""
    import torch

    from cuvil_edge.agent.torch_model import IRTorchModule

    t = site.training
    model = IRTorchModule(graph)
    x = torch.from_numpy(np.ascontiguousarray(data.x, dtype=np.float32))
    y = torch.from_numpy(np.asarray(data.y, dtype=np.int64))
    optimizer = torch.optim.SGD(model.parameters(), lr=t.learning_rate, momentum=t.momentum)
    criterion = torch.nn.CrossEntropyLoss()
    steps, loss = 0, float("nan")
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model.train()
        for _ in range(t.local_epochs):
            order = torch.randperm(len(y))
            for start in range(0, len(y), t.batch_size):
                idx = order[start:start + t.batch_size]
                optimizer.zero_grad(set_to_none=True)
                batch_loss = criterion(model(x[idx]), y[idx])
                batch_loss.backward()
                optimizer.step()
                steps, loss = steps + 1, float(batch_loss.detach())
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    weights.update(model.ir_weights())
    return TrainOutcome(weights, 0.0, 0.0, t.batch_size / len(y), steps, loss)
