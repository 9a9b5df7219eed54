"""The global model after each completed round, in the coordinator home (no pickle).

``<home>/checkpoints/<federation>/round-<NNNNN>.npz`` holds the round's aggregated weights
(``np.savez``, read back with ``allow_pickle=False``), written atomically, so a coordinator
killed between rounds resumes from the last completed one (`--resume`). Under central DP the same
file holds the accountant's state (its releases so far, as JSON bytes under
:data:`ACCOUNTANT_KEY`): weights and ε are written in one atomic step, so a resumed run can never
continue with weights whose privacy cost it forgot. A server optimiser's state (FedAvgM's momentum,
FedAdam's and FedYogi's moments; :mod:`cuvil_edge.coordinator.server_optimiser`) is stored beside the
weights under :data:`OPTIMISER_PREFIX`, so a resumed run continues the optimiser too.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.federation import load_federation
from cuvil_edge.config.run_spec import RunSpec
from cuvil_edge.errors import ConfigError, StateError

_NAME = re.compile(r"^round-(\d{5})\.npz$")
#: The array holding the central-DP accountant's state (UTF-8 JSON); no weight may use this name.
ACCOUNTANT_KEY = "__central_dp_accountant__"
#: Arrays of the server optimiser's state: ``OPTIMISER_PREFIX + "<Flower class>/<slot>/<weight>"``.
OPTIMISER_PREFIX = "__server_optimiser__/"


@dataclass(frozen=True)
class Checkpoint:
    round: int
    weights: dict[str, np.ndarray]
    path: Path
    accountant: Optional[dict] = None  # Flower's RdpAccountant.state_dict() under central DP
    optimiser: dict[str, np.ndarray] = field(default_factory=dict)  # server_optimiser.optimiser_state()


def checkpoint_dir(home: Path, federation: str) -> Path:
    return Path(home) / "checkpoints" / federation


def save_checkpoint(home: Path, federation: str, server_round: int, weights: Mapping[str, np.ndarray],
                    accountant: Optional[dict] = None, optimiser: Optional[Mapping[str, np.ndarray]] = None) -> Path:
    """Write the weights (and the central-DP ``accountant`` state, and the server ``optimiser``'s)
    after ``server_round`` (atomic: a crash leaves the previous checkpoints).

    Raises:
        StateError: the checkpoint cannot be written, or a weight's name is one checkpoints reserve
            (:data:`ACCOUNTANT_KEY`, or starting with :data:`OPTIMISER_PREFIX`).
    """
    reserved = [k for k in weights if k == ACCOUNTANT_KEY or k.startswith(OPTIMISER_PREFIX)]
    if reserved:
        raise StateError(f"a weight is named {reserved[0]!r}, which checkpoints reserve; rename it in the model")
    arrays = {k: np.asarray(v) for k, v in weights.items()}
    arrays.update({OPTIMISER_PREFIX + k: np.asarray(v) for k, v in (optimiser or {}).items()})
    if accountant is not None:
        arrays[ACCOUNTANT_KEY] = np.frombuffer(json.dumps(accountant, sort_keys=True).encode(), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path = checkpoint_dir(home, federation) / f"round-{server_round:05d}.npz"
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, buffer.getvalue(), mode=0o600)
    except OSError as e:
        raise StateError(f"cannot write checkpoint {path}: {e}") from e
    return path


def latest_checkpoint(home: Path, federation: str) -> Checkpoint | None:
    """The newest checkpoint of ``federation``, or None.

    Raises:
        StateError: it is unreadable (never silently skipped: resuming from an older one would
            repeat rounds).
    """
    folder = checkpoint_dir(home, federation)
    found = sorted((int(m.group(1)), p) for p in folder.glob("round-*.npz") if (m := _NAME.match(p.name)))
    if not found:
        return None
    server_round, path = found[-1]
    try:
        with np.load(path, allow_pickle=False) as data:
            weights = {k: np.array(data[k]) for k in data.files}
        state = weights.pop(ACCOUNTANT_KEY, None)
        optimiser = {k[len(OPTIMISER_PREFIX):]: weights.pop(k) for k in list(weights) if k.startswith(OPTIMISER_PREFIX)}
        accountant = None if state is None else json.loads(state.tobytes().decode())
        if accountant is not None and not isinstance(accountant, dict):
            raise ValueError("the accountant state is not a JSON object")
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise StateError(f"checkpoint {path} is unreadable ({e}); remove it to resume from the one before") from e
    return Checkpoint(server_round, weights, path, accountant, optimiser)


def resumed(spec: RunSpec) -> RunSpec:
    """``spec`` continued from its federation's newest checkpoint: the rounds left, numbered on.

    Raises:
        ConfigError: there is no checkpoint, or every round is already done.
        StateError: the newest checkpoint is unreadable.
    """
    federation = load_federation(spec.federation)
    last = latest_checkpoint(Path(spec.home), federation.name)
    if last is None:
        raise ConfigError(f"nothing to resume: {spec.home} has no checkpoint of federation {federation.name!r}")
    if last.round >= spec.rounds:
        raise ConfigError(f"federation {federation.name!r} already completed {last.round} of {spec.rounds} rounds")
    return replace(spec, rounds=spec.rounds - last.round, start_round=last.round)
