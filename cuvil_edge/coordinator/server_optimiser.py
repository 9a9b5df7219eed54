"""The server optimiser's state of a Flower strategy, as named arrays a checkpoint can hold.

FedAvgM keeps a momentum vector, FedAdam and FedYogi (Flower's ``FedOpt`` family) their first and
second moments. They live in the Flower strategy object, so a coordinator restarted with
``--resume`` would start them from zero: FedAvgM's first resumed step would lose its momentum and
FedAdam's its variance estimate, and the resumed run would no longer be the run it continues.
:func:`optimiser_state` reads them out as ``<Flower class>/<slot>/<weight name>`` -> array and
:func:`restore_optimiser` puts them back before the resumed run's first round.

FedAdam's bias correction counts rounds; :class:`~cuvil_edge.coordinator.strategy.SitePackages`
numbers its rounds on from the checkpoint (``round_offset``) when it calls the strategy's
``aggregate_train``, so that count continues too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np
from flwr.serverapp.strategy import FedAvgM
from flwr.serverapp.strategy.fedopt import FedOpt

from cuvil_edge.errors import StateError

log = logging.getLogger(__name__)

#: FedOpt's per-weight moments (attribute name == slot name).
FEDOPT_SLOTS = ("m_t", "v_t")
#: FedAvgM's momentum vector: a list in the order of the weights it was given.
MOMENTUM_SLOT = "momentum"


def optimiser_state(strategy, keys: Iterable[str]) -> dict[str, np.ndarray]:
    """The server optimiser state of ``strategy`` (empty for FedAvg and FedProx, and before the
    first aggregation). ``keys``: the weight names in the order the run passes them to Flower
    (FedAvgM's momentum is a list in that order)."""
    prefix = type(strategy).__name__
    state: dict[str, np.ndarray] = {}
    if isinstance(strategy, FedOpt):
        for slot in FEDOPT_SLOTS:
            for name, value in (getattr(strategy, slot) or {}).items():
                state[f"{prefix}/{slot}/{name}"] = np.asarray(value)
    elif isinstance(strategy, FedAvgM) and strategy.momentum_vector is not None:
        for name, value in zip(list(keys), strategy.momentum_vector, strict=True):
            state[f"{prefix}/{MOMENTUM_SLOT}/{name}"] = np.asarray(value)
    return state


def restore_optimiser(strategy, state: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> bool:
    """Give ``strategy`` the optimiser ``state`` a checkpoint holds; True when restored.

    State of another strategy (the federation file now names a different one) is left out with a
    warning: the weights still continue, the new optimiser starts from zero.

    Raises:
        StateError: the state is for this strategy but does not match the model's weights
            (names, shapes), so it would corrupt the next update.
    """
    if not state:
        return False
    prefix = type(strategy).__name__
    mine = {k[len(prefix) + 1 :]: v for k, v in state.items() if k.startswith(prefix + "/")}
    if not mine:
        others = sorted({k.split("/", 1)[0] for k in state})
        log.warning(
            "the checkpoint holds %s optimiser state; the federation now runs %s, whose optimiser starts from zero",
            ", ".join(others),
            prefix,
        )
        return False
    slots: dict[str, dict[str, np.ndarray]] = {}
    for key, value in mine.items():
        slot, _, name = key.partition("/")
        slots.setdefault(slot, {})[name] = value
    expected = FEDOPT_SLOTS if isinstance(strategy, FedOpt) else (MOMENTUM_SLOT,)
    for slot, arrays in slots.items():
        shapes = {k: v.shape for k, v in arrays.items()}
        if slot not in expected or shapes != {k: np.shape(v) for k, v in weights.items()}:
            raise StateError(
                f"the checkpoint's {prefix} state {slot!r} does not match the model's weights; "
                "resume with the model and federation file it ran with, or start afresh"
            )
    if isinstance(strategy, FedOpt):
        for slot in FEDOPT_SLOTS:
            setattr(strategy, slot, slots.get(slot))
    else:
        strategy.momentum_vector = [slots[MOMENTUM_SLOT][name] for name in weights]
    return True
