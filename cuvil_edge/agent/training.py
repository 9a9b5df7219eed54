"""One round of local DP-SGD on the agent, paid for from the site's ledger first."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuvil_edge.config.site import SiteConfig
from cuvil_edge.datasets.records import Records
from cuvil_edge.errors import BudgetExhaustedError
from cuvil_edge.extras import require
from cuvil_edge.ir.graph import Graph
from cuvil_edge.privacy import PrivacyLedger


@dataclass(frozen=True)
class TrainOutcome:
    weights: dict[str, np.ndarray]  # every float32 initializer, trained ones updated
    epsilon_round: float  # infinite without local DP: the update carries no record-level guarantee
    noise_multiplier: float
    sample_rate: float
    steps: int
    loss: float


def train_round(
    graph: Graph,
    site: SiteConfig,
    data: Records,
    ledger: PrivacyLedger,
    server_round: int,
    package_version: int,
    seed: int | None = None,
    local_dp: bool = True,
    proximal_mu: object = 0.0,
    plan_cache: Path | None = None,
) -> TrainOutcome:
    """Check the model keeps samples apart, claim this round's DP-SGD spend, then train.

    The plan (σ, sample rate, steps) comes from the site YAML only, never from the data, and
    is reserved in the ledger under the key ``train-r<round>-v<package version>`` *before*
    anything touches the data: the claim is exclusive, so a replayed or duplicated train
    message is refused (:class:`ReplayError`) instead of training again with fresh noise.
    With ``local_dp=False`` (federation ``local_dp: false``, e.g. central DP only) the round
    trains with plain SGD and spends nothing: its update carries no record-level guarantee
    (``epsilon_round`` is infinite). ``proximal_mu`` (FedProx's ``proximal-mu`` from the train
    config) > 0 adds ``mu/2 * ||w - w_received||^2`` to the local objective; under DP-SGD it is
    added after clipping and noise, so the round costs the same ε (privacy.dpsgd.proximal_gradient).

    Raises:
        BatchMixingError: the training graph mixes samples across the batch (refused before
            anything is reserved).
        UnsupportedOpError: an op has no torch lowering for training (refused before anything
            is reserved).
        ReplayError: this round's key was already claimed.
        BudgetExhaustedError: the round would take the site over its budget (nothing reserved).
        PrivacyError: the hyperparameters cannot give the target ε, the data is unusable, or
            ``proximal_mu`` is not a finite number >= 0 (refused before anything is reserved).
        MissingDependencyError: torch or opacus is not installed (refused before anything is
            reserved; a device that only evaluates and infers installs neither).
    """
    require(("torch", "opacus"), "training needs torch and opacus", "train")
    from cuvil_edge.agent.torch_model import IRTorchModule
    from cuvil_edge.passes import split_fused_blocks
    from cuvil_edge.privacy._checks import positive_finite
    from cuvil_edge.privacy.accounting import DpSgd
    from cuvil_edge.privacy.batch_independence import check_batch_independent
    from cuvil_edge.privacy.dpsgd import plan_dp_sgd, train_dp_sgd

    graph = split_fused_blocks(graph)  # fused blocks have no torch lowering: train their convolutions
    p, t = site.privacy, site.training
    mu = positive_finite("proximal-mu", proximal_mu, allow_zero=True)
    if not local_dp:
        return _train_plain(graph, site, data, seed, mu)
    check_batch_independent(graph)  # per-sample clipping is meaningless if rows mix
    model = IRTorchModule(graph)  # an op without a training lowering is refused before anything is reserved
    plan = plan_dp_sgd(
        target_epsilon=p.epsilon_per_round,
        delta=p.delta,
        sample_rate=t.sample_rate,
        epochs=t.local_epochs,
        expected_batch_size=t.batch_size,
        cache_dir=plan_cache,
    )
    event = DpSgd(plan.noise_multiplier, plan.sample_rate, plan.steps)
    exceeds, total = ledger.would_exceed(event)
    if exceeds:
        raise BudgetExhaustedError(
            f"site {site.site}: round {server_round} would bring ε to {total:.3f}, over the budget "
            f"{ledger.epsilon_budget}; the site sits this round out"
        )
    # the ledger's one way to charge: reserved before the data is touched, aborted if training raises
    with ledger.claim(event, key=train_key(server_round, package_version), round=server_round) as reservation:
        result = train_dp_sgd(
            model,
            data.x,
            data.y,
            plan,
            lr=t.learning_rate,
            momentum=t.momentum,
            max_grad_norm=t.max_grad_norm,
            seed=seed,
            proximal_mu=mu,
        )
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    weights.update(model.ir_weights())
    # the round's ε as the ledger charges it (PLD); result.epsilon is the RDP ε it was planned at
    return TrainOutcome(
        weights, reservation.epsilon, plan.noise_multiplier, plan.sample_rate, plan.steps, result.final_loss
    )


def train_key(server_round: int, package_version: int) -> str:
    """The ledger key of one round's training: one claim per (round, package)."""
    return f"train-r{server_round}-v{package_version}"


def _train_plain(
    graph: Graph, site: SiteConfig, data: Records, seed: int | None, proximal_mu: float = 0.0
) -> TrainOutcome:
    """Non-private minibatch SGD with the site's hyperparameters (no ledger spend), plus FedProx's
    proximal gradient when ``proximal_mu`` > 0."""
    import torch

    from cuvil_edge.agent.torch_model import IRTorchModule
    from cuvil_edge.privacy.dpsgd import proximal_gradient

    t = site.training
    model = IRTorchModule(graph)
    x = torch.from_numpy(np.ascontiguousarray(data.x, dtype=np.float32))
    y = torch.from_numpy(np.asarray(data.y, dtype=np.int64))
    optimizer = torch.optim.SGD(model.parameters(), lr=t.learning_rate, momentum=t.momentum)
    criterion = torch.nn.CrossEntropyLoss()
    proximal = proximal_gradient(model, proximal_mu)
    steps, loss = 0, float("nan")
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model.train()
        for _ in range(t.local_epochs):
            order = torch.randperm(len(y))
            for start in range(0, len(y), t.batch_size):
                idx = order[start : start + t.batch_size]
                optimizer.zero_grad(set_to_none=True)
                batch_loss = criterion(model(x[idx]), y[idx])
                batch_loss.backward()
                if proximal is not None:
                    proximal(model.parameters())
                optimizer.step()
                steps, loss = steps + 1, float(batch_loss.detach())
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    weights.update(model.ir_weights())
    return TrainOutcome(weights, math.inf, 0.0, t.sample_rate, steps, loss)
