"""DP-SGD local training with Opacus (the only module that trains with opacus).

Plan first, then train: :func:`plan_dp_sgd` (or :func:`steps_for`,
:func:`sample_rate_for` and :func:`noise_multiplier_for`) gives the exact
``(noise_multiplier, sample_rate, steps)`` that :func:`train_dp_sgd` will use,
so the agent can ask the ledger (``would_exceed_dpsgd`` / ``reserve_dpsgd``)
before any training happens.

torch and opacus are imported inside the functions that need them.
"""

from __future__ import annotations

import logging
import secrets
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy._checks import int_at_least, positive_finite

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_LOSSES = ("cross_entropy", "mse")

# Opacus/torch warnings that are known and harmless for how we call them.
_HARMLESS_WARNINGS = (
    r"Secure RNG turned off",  # secure_mode needs torchcsprng, not installable (notes §1)
    r"Full backward hook is firing when gradients are computed with respect to module outputs",
    r"Using a non-full backward hook when the forward contains multiple autograd Nodes",
    r"Optimal order is the (largest|smallest) alpha",
)


@dataclass(frozen=True)
class DpSgdPlan:
    """The privacy parameters of one DP-SGD run, known before training."""

    noise_multiplier: float
    sample_rate: float
    steps: int


@dataclass(frozen=True)
class DpSgdResult:
    """What a DP-SGD run spent and how it ended."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    epsilon: float
    final_loss: float


@contextmanager
def _quiet_opacus() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in _HARMLESS_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        yield


def batches_per_epoch(n: int, batch_size: int) -> int:
    """Batches per epoch: ``ceil(n / batch_size)``, the length of the loader Opacus wraps.

    Raises:
        PrivacyError: ``n`` or ``batch_size`` is not a positive int.
    """
    int_at_least("n", n)
    int_at_least("batch_size", batch_size)
    return -(-n // batch_size)


def sample_rate_for(n: int, batch_size: int) -> float:
    """Poisson sampling rate Opacus uses: ``1 / batches_per_epoch``.

    Raises:
        PrivacyError: ``n`` or ``batch_size`` is not a positive int.
    """
    return 1.0 / batches_per_epoch(n, batch_size)


def steps_for(n: int, batch_size: int, epochs: int) -> int:
    """Optimizer steps of a run: Opacus' Poisson loader yields ``batches_per_epoch`` per epoch.

    Raises:
        PrivacyError: an argument is not a positive int.
    """
    return int_at_least("epochs", epochs) * batches_per_epoch(n, batch_size)


def noise_multiplier_for(target_epsilon: float, delta: float, sample_rate: float,
                         steps: int) -> float:
    """Smallest noise multiplier (RDP accountant) reaching ``target_epsilon`` at ``delta``.

    Raises:
        PrivacyError: invalid arguments, or the target is unreachable.
    """
    eps = positive_finite("target_epsilon", target_epsilon)
    d = positive_finite("delta", delta)
    q = positive_finite("sample_rate", sample_rate)
    if d >= 1 or q > 1:
        raise PrivacyError(f"need 0 < delta < 1 and 0 < sample_rate <= 1, got {d}, {q}")
    int_at_least("steps", steps)
    from opacus.accountants.utils import get_noise_multiplier  # lazy: pulls in torch

    try:
        with _quiet_opacus():
            return float(get_noise_multiplier(target_epsilon=eps, target_delta=d,
                                              sample_rate=q, steps=steps, accountant="rdp"))
    except ValueError as e:
        raise PrivacyError(
            f"cannot reach epsilon={eps} at delta={d} with q={q}, {steps} steps: {e}"
        ) from e


def plan_dp_sgd(n: int, *, target_epsilon: float, delta: float, epochs: int,
                batch_size: int) -> DpSgdPlan:
    """The (noise_multiplier, sample_rate, steps) :func:`train_dp_sgd` will use.

    Raises:
        PrivacyError: invalid arguments, fewer samples than a batch, or an
            unreachable target.
    """
    int_at_least("n", n)
    int_at_least("batch_size", batch_size)
    if n < batch_size:
        raise PrivacyError(
            f"only {n} samples for batch_size {batch_size}; DP-SGD needs at least one full "
            "batch. Lower batch_size or collect more data."
        )
    q = sample_rate_for(n, batch_size)
    steps = steps_for(n, batch_size, epochs)
    # Opacus' make_private_with_epsilon calibrates σ for int(epochs / q) steps (a float
    # division that can land one below the steps the loader really takes). Use the
    # same σ so training and ledger agree exactly, but charge the steps that run.
    calibration_steps = int(int_at_least("epochs", epochs) / q)
    return DpSgdPlan(noise_multiplier_for(target_epsilon, delta, q, calibration_steps), q, steps)


def _tensors(x: np.ndarray, y: np.ndarray, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim < 1 or y.ndim < 1 or len(x) != len(y):
        raise PrivacyError(f"x and y must have the same first dimension, got {x.shape}, {y.shape}")
    if not np.issubdtype(x.dtype, np.number) or not np.all(np.isfinite(x)):
        raise PrivacyError("x must be finite numbers")
    if loss == "cross_entropy":
        if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1 or (y < 0).any():
            raise PrivacyError("cross_entropy needs y as a 1-D array of non-negative class ids")
        ty = torch.from_numpy(y.astype(np.int64))
    else:
        if not np.issubdtype(y.dtype, np.number) or not np.all(np.isfinite(y)):
            raise PrivacyError("mse needs finite numeric targets y")
        ty = torch.from_numpy(y.astype(np.float32))
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), ty


def train_dp_sgd(
    model: Any,
    x: np.ndarray,
    y: np.ndarray,
    *,
    target_epsilon: float,
    delta: float,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    max_grad_norm: float,
    seed: int | None,
    loss: str = "cross_entropy",
) -> DpSgdResult:
    """Train ``model`` (a ``torch.nn.Module``) in place with DP-SGD (Opacus, RDP accountant).

    Poisson sampling with rate ``1/ceil(n/batch_size)`` for ``epochs`` epochs,
    made private with Opacus' ``make_private_with_epsilon``; training is refused
    unless the σ Opacus picks is :func:`plan_dp_sgd`'s, the one the ledger was
    asked about. ``epsilon`` in the result is the RDP epsilon of
    the planned run at ``delta`` (empty Poisson batches are skipped, which only
    over-counts). ``seed`` makes sampling and noise reproducible (tests); a
    seed known to an adversary voids the guarantee, so pass ``None`` in
    production to draw it from ``secrets``. The global torch RNG state is
    restored afterwards.

    Raises:
        PrivacyError: invalid arguments or data, a model Opacus cannot train
            (e.g. BatchNorm: fix it with ``opacus.validators.ModuleValidator.fix``
            first), or an unreachable target.
    """
    import torch

    if loss not in _LOSSES:
        raise PrivacyError(f"loss must be one of {_LOSSES}, got {loss!r}")
    if not isinstance(model, torch.nn.Module):
        raise PrivacyError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for name, v in (("lr", lr), ("max_grad_norm", max_grad_norm)):
        positive_finite(name, v)
    positive_finite("momentum", momentum, allow_zero=True)
    tx, ty = _tensors(x, y, loss)
    plan = plan_dp_sgd(len(tx), target_epsilon=target_epsilon, delta=delta,
                       epochs=epochs, batch_size=batch_size)
    _validate_module(model)
    if seed is None:
        seed = secrets.randbits(63)
    with _quiet_opacus(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        final_loss, epsilon = _train(model, tx, ty, plan, epochs=epochs, batch_size=batch_size,
                                     lr=lr, momentum=momentum, max_grad_norm=max_grad_norm,
                                     target_epsilon=target_epsilon, delta=delta, loss=loss)
    return DpSgdResult(plan.noise_multiplier, plan.sample_rate, plan.steps, epsilon, final_loss)


def _validate_module(model: Any) -> None:
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise PrivacyError(
            f"Opacus cannot train this model with DP-SGD: {'; '.join(map(str, errors[:3]))}. "
            "Apply opacus.validators.ModuleValidator.fix (it returns a copy) before training."
        )


def _train(model: Any, tx: Any, ty: Any, plan: DpSgdPlan, *, epochs: int, batch_size: int,
           lr: float, momentum: float, max_grad_norm: float, target_epsilon: float,
           delta: float, loss: str) -> tuple[float, float]:
    import torch
    from opacus import PrivacyEngine

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tx, ty),
                                         batch_size=batch_size)
    criterion = torch.nn.CrossEntropyLoss() if loss == "cross_entropy" else torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    engine = PrivacyEngine(accountant="rdp")
    dp_model, dp_optimizer, dp_loader = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=loader, target_epsilon=target_epsilon,
        target_delta=delta, epochs=epochs, max_grad_norm=max_grad_norm, poisson_sampling=True,
    )
    sigma = float(dp_optimizer.noise_multiplier)
    if len(dp_loader) * epochs != plan.steps or abs(sigma - plan.noise_multiplier) > 1e-9 * plan.noise_multiplier:
        dp_model.to_standard_module()
        # Never train with less noise, or more steps, than the ledger was asked about.
        raise PrivacyError(
            f"Opacus chose σ={sigma} for {len(dp_loader) * epochs} steps; the plan (checked against the "
            f"ledger) says σ={plan.noise_multiplier} for {plan.steps} steps. Refusing to train."
        )
    model.train()
    last, taken = float("nan"), 0
    try:
        for _ in range(epochs):
            for bx, by in dp_loader:
                if len(bx) == 0:  # Poisson sampling can draw an empty batch
                    continue
                dp_optimizer.zero_grad(set_to_none=True)
                out = dp_model(bx)
                batch_loss = criterion(out, by)
                batch_loss.backward()
                dp_optimizer.step()
                last, taken = float(batch_loss.detach()), taken + 1
    finally:
        dp_optimizer.zero_grad(set_to_none=True)
        trained = dp_model.to_standard_module()  # removes hooks and per-sample grad attrs
    if trained is not model:  # GradSampleModule shares parameters; copy if it ever stops
        model.load_state_dict(trained.state_dict())
    # Charge the planned run (an upper bound on the steps actually taken).
    from cuvil_edge.privacy.ledger import dpsgd_epsilon

    epsilon = dpsgd_epsilon([(plan.noise_multiplier, plan.sample_rate, plan.steps)], delta)
    logger.info("DP-SGD: %d steps planned (%d taken), sigma=%.4g, q=%.4g, eps=%.4g",
                plan.steps, taken,
                plan.noise_multiplier, plan.sample_rate, epsilon)
    return last, epsilon
