"""DP-SGD local training with Opacus (the only module that trains with opacus).

Plan first, then train: :func:`plan_dp_sgd` gives the exact ``(noise_multiplier, sample_rate,
steps)`` of a run from public configuration only (the site YAML's sample rate, epochs, expected
batch size and per-round ε): the private dataset's size never enters the plan, so the ε a site
reports and the noise it adds say nothing about how many records it holds. The agent asks the
ledger (``would_exceed`` / ``reserve``) with that plan before any training happens, and
:func:`train_dp_sgd` runs exactly that plan.

Unit of privacy: one record; neighbouring datasets differ by adding or removing one record
(Opacus' relation for Poisson-sampled DP-SGD).

torch and opacus are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy._checks import int_at_least, positive_finite

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_LOSSES = ("cross_entropy", "mse")

# Opacus/torch warnings that are known and harmless for how we call them.
_HARMLESS_WARNINGS = (
    r"Secure RNG turned off",  # secure_mode needs torchcsprng, which has no release for torch 2.x
    r"Full backward hook is firing when gradients are computed with respect to module outputs",
    r"Using a non-full backward hook when the forward contains multiple autograd Nodes",
    r"Optimal order is the (largest|smallest) alpha",
)


@dataclass(frozen=True)
class DpSgdPlan:
    """The privacy parameters of one DP-SGD run, known before training and independent of the data.

    ``expected_batch_size`` only normalises the noisy gradient sum (a public constant, so the
    update's scale does not reveal the dataset size).
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    expected_batch_size: int
    delta: float


@dataclass(frozen=True)
class DpSgdResult:
    """What a DP-SGD run spent and how it ended."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    epsilon: float
    final_loss: float
    empty_batches: int


@contextmanager
def _quiet_opacus() -> Iterator[None]:
    # Opacus logs a warning for every empty Poisson batch; with a small sample rate that is
    # expected, and the step still adds noise (see _train).
    loader_log = logging.getLogger("opacus.data_loader")
    level = loader_log.level
    loader_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for message in _HARMLESS_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        loader_log.setLevel(level)


def steps_for(sample_rate: float, epochs: int) -> int:
    """Steps of a run: ``ceil(epochs / sample_rate)`` (one epoch = 1/q expected batches).

    Raises:
        PrivacyError: bad arguments.
    """
    q = positive_finite("sample_rate", sample_rate)
    if q > 1:
        raise PrivacyError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    return math.ceil(int_at_least("epochs", epochs) / q)


@lru_cache(maxsize=256)
def noise_multiplier_for(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Smallest noise multiplier (RDP accountant) reaching ``target_epsilon`` at ``delta``.

    A pure function of public configuration, remembered per process: Opacus' search costs
    seconds (about 13 RDP evaluations over 150 orders), and every round asks the same question.

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
            return float(
                get_noise_multiplier(target_epsilon=eps, target_delta=d, sample_rate=q, steps=steps, accountant="rdp")
            )
    except ValueError as e:
        raise PrivacyError(f"cannot reach epsilon={eps} at delta={d} with q={q}, {steps} steps: {e}") from e


#: File, in a plan cache directory, of noise multipliers already searched (:func:`plan_dp_sgd`).
NOISE_CACHE = "noise-multipliers.json"
#: Opacus' search stops within this much below the target ε; a remembered σ further below is searched again.
_SEARCH_TOLERANCE = 0.01


def plan_dp_sgd(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    epochs: int,
    expected_batch_size: int,
    cache_dir: Path | None = None,
) -> DpSgdPlan:
    """The (noise_multiplier, sample_rate, steps) :func:`train_dp_sgd` will use, from public
    configuration only.

    With ``cache_dir`` (a site's state directory) the noise multiplier is remembered there across
    processes: a device handles every message in a fresh process, and the search costs seconds.

    Raises:
        PrivacyError: invalid arguments or an unreachable target.
    """
    steps = steps_for(sample_rate, epochs)
    args = (target_epsilon, delta, sample_rate, steps)
    sigma = noise_multiplier_for(*args) if cache_dir is None else _remembered_noise(*args, Path(cache_dir))
    return DpSgdPlan(
        sigma, float(sample_rate), steps, int_at_least("expected_batch_size", expected_batch_size), float(delta)
    )


def _remembered_noise(target_epsilon: float, delta: float, sample_rate: float, steps: int, cache_dir: Path) -> float:
    """:func:`noise_multiplier_for`, remembered in ``cache_dir``. A remembered σ is used only after
    the ledger's accountant confirms it reaches the target (and no more than the search's tolerance
    below it), so a damaged or edited file can cost a search, never privacy."""
    from cuvil_edge.atomic import atomic_write
    from cuvil_edge.privacy.ledger import dpsgd_epsilon

    path, key = cache_dir / NOISE_CACHE, json.dumps([target_epsilon, delta, sample_rate, steps])
    try:
        remembered = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        remembered = {}
    remembered = remembered if isinstance(remembered, dict) else {}
    sigma = remembered.get(key)
    if isinstance(sigma, float) and math.isfinite(sigma) and sigma > 0:
        reached = dpsgd_epsilon([(sigma, sample_rate, steps)], delta)
        if target_epsilon - 2 * _SEARCH_TOLERANCE <= reached <= target_epsilon * (1 + 1e-9):
            return sigma
    sigma = noise_multiplier_for(target_epsilon, delta, sample_rate, steps)
    remembered[key] = sigma
    try:
        atomic_write(path, json.dumps(remembered, sort_keys=True).encode())
    except OSError:
        pass  # a cache only: the next process searches again
    return sigma


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
    plan: DpSgdPlan,
    *,
    lr: float,
    momentum: float,
    max_grad_norm: float,
    seed: int | None,
    loss: str = "cross_entropy",
    proximal_mu: float = 0.0,
) -> DpSgdResult:
    """Train ``model`` (a ``torch.nn.Module``) in place with DP-SGD, exactly as ``plan`` says.

    Opacus' parts, assembled so that nothing depends on the dataset size: a Poisson loader with
    the plan's sample rate (``DPDataLoader``), per-sample gradients (``GradSampleModule``), and a
    ``DPOptimizer`` that clips each sample's gradient to ``max_grad_norm``, adds Gaussian noise of
    std ``noise_multiplier * max_grad_norm`` to the sum and divides by the plan's public expected
    batch size. Exactly ``plan.steps`` steps run; an empty Poisson batch still takes a noisy step.
    ``seed`` makes sampling and noise reproducible (tests); a seed known to an adversary voids
    the guarantee, so pass ``None`` in production to draw it from ``secrets``. The global torch
    RNG state is restored afterwards. ``proximal_mu`` > 0 adds FedProx's proximal term
    ``mu/2 * ||w - w_start||^2`` (``w_start``: the weights the model starts from, the ones the
    coordinator sent) to the objective, at no privacy cost (see :func:`proximal_gradient`).

    Raises:
        PrivacyError: invalid arguments or data, or a model Opacus cannot train (e.g.
            BatchNorm: fix it with ``opacus.validators.ModuleValidator.fix`` first).
    """
    import torch

    if loss not in _LOSSES:
        raise PrivacyError(f"loss must be one of {_LOSSES}, got {loss!r}")
    if not isinstance(model, torch.nn.Module):
        raise PrivacyError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(plan, DpSgdPlan):
        raise PrivacyError("train_dp_sgd needs the DpSgdPlan the ledger was charged for")
    for name, v in (("lr", lr), ("max_grad_norm", max_grad_norm)):
        positive_finite(name, v)
    positive_finite("momentum", momentum, allow_zero=True)
    mu = positive_finite("proximal_mu", proximal_mu, allow_zero=True)
    tx, ty = _tensors(x, y, loss)
    _validate_module(model)
    if seed is None:
        seed = secrets.randbits(63)
    with _quiet_opacus(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        final_loss, empty = _train(
            model, tx, ty, plan, lr=lr, momentum=momentum, max_grad_norm=max_grad_norm, loss=loss, proximal_mu=mu
        )
    from cuvil_edge.privacy.ledger import dpsgd_epsilon

    epsilon = dpsgd_epsilon([(plan.noise_multiplier, plan.sample_rate, plan.steps)], plan.delta)
    return DpSgdResult(plan.noise_multiplier, plan.sample_rate, plan.steps, epsilon, final_loss, empty)


def _validate_module(model: Any) -> None:
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise PrivacyError(
            f"Opacus cannot train this model with DP-SGD: {'; '.join(map(str, errors[:3]))}. "
            "Apply opacus.validators.ModuleValidator.fix (it returns a copy) before training."
        )


def proximal_gradient(model: Any, mu: float):
    """A function adding FedProx's proximal gradient ``mu * (w - w_start)`` to each parameter's
    ``.grad`` (``w_start``: the parameters now, i.e. the weights the coordinator sent); None when
    ``mu`` is 0. The gradient of ``mu/2 * ||w - w_start||^2``, added to the loss's gradient.

    Under DP-SGD it is added to the gradient Opacus already clipped, summed, noised and averaged
    (a DPOptimizer step hook). That costs no privacy: ``w_start`` is public (the coordinator's
    weights) and ``w`` is a function of the earlier noised steps only, so the term reads no record;
    the step is post-processing of the released noisy gradient, and its ε is that of (σ, q,
    steps) exactly as planned and charged. (Adding ``mu/2 * ||w - w_start||^2`` to the per-sample
    loss instead would put the term inside the clipping and change what is clipped.)
    """
    import torch

    if mu == 0:
        return None
    start = {id(p): p.detach().clone() for p in model.parameters() if p.requires_grad}

    def add(params) -> None:
        with torch.no_grad():
            for p in params:
                if p.grad is not None and id(p) in start:
                    p.grad.add_(p.detach() - start[id(p)], alpha=mu)

    return add


def _train(
    model: Any,
    tx: Any,
    ty: Any,
    plan: DpSgdPlan,
    *,
    lr: float,
    momentum: float,
    max_grad_norm: float,
    loss: str,
    proximal_mu: float = 0.0,
) -> tuple[float, int]:
    import torch
    from opacus import GradSampleModule
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer

    loader = DPDataLoader(torch.utils.data.TensorDataset(tx, ty), sample_rate=plan.sample_rate)
    # Per-sample losses are summed: each sample's gradient is its own, whatever the batch size,
    # and an empty batch gives a zero sum (a mean would be NaN); the optimizer divides the noisy
    # sum by the public expected batch size.
    criterion = (
        torch.nn.CrossEntropyLoss(reduction="sum") if loss == "cross_entropy" else torch.nn.MSELoss(reduction="sum")
    )
    dp_model = GradSampleModule(model, loss_reduction="sum")
    dp_optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
        noise_multiplier=plan.noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=plan.expected_batch_size,
        loss_reduction="mean",
    )
    proximal = proximal_gradient(model, proximal_mu)
    if proximal is not None:  # runs after clip + noise + scaling, before the SGD step
        dp_optimizer.attach_step_hook(lambda optimizer: proximal(optimizer.params))
    model.train()
    last, taken, empty = float("nan"), 0, 0
    try:
        while taken < plan.steps:
            for bx, by in loader:
                if taken == plan.steps:
                    break
                dp_optimizer.zero_grad(set_to_none=True)
                out = dp_model(bx)
                batch_loss = criterion(out, by) if len(bx) else out.sum() * 0.0
                batch_loss.backward()
                dp_optimizer.step()  # clip, sum, add noise (also for an empty batch), average, step
                taken, empty = taken + 1, empty + (len(bx) == 0)
                if len(bx):
                    last = float(batch_loss.detach()) / len(bx)
    finally:
        dp_optimizer.zero_grad(set_to_none=True)
        trained = dp_model.to_standard_module()  # removes hooks and per-sample grad attrs
    if trained is not model:  # GradSampleModule shares parameters; copy if it ever stops
        model.load_state_dict(trained.state_dict())
    logger.info(
        "DP-SGD: %d steps (%d empty batches), sigma=%.4g, q=%.4g", taken, empty, plan.noise_multiplier, plan.sample_rate
    )
    return last, empty
