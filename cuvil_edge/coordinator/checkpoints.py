"""The global model after each completed round, in the coordinator home (no pickle), authenticated.

``<home>/checkpoints/<federation>/round-<NNNNN>.npz`` holds the round's aggregated weights
(``np.savez``, read back with ``allow_pickle=False``), written atomically, so a coordinator
killed between rounds resumes from the last completed one (`--resume`). Under central DP the same
file holds the accountant's state (its releases so far, as JSON bytes under
:data:`ACCOUNTANT_KEY`): weights and ε are written in one atomic step, so a resumed run can never
continue with weights whose privacy cost it forgot. A server optimiser's state (FedAvgM's momentum,
FedAdam's and FedYogi's moments; :mod:`cuvil_edge.coordinator.server_optimiser`) is stored beside the
weights under :data:`OPTIMISER_PREFIX`, so a resumed run continues the optimiser too; the run's
planned total rounds under :data:`PLANNED_KEY`, so a resumed run does the rest of that plan.

**Authentication.** A resumed run signs the checkpoint's weights into every
site's package and trusts its accountant state for ε, so the file is authenticated: each one holds
an HMAC-SHA256 (under :data:`MAC_KEY`) over the federation name, the round and every other array
(name, dtype, shape, bytes; see :func:`_mac`), keyed by a 32-byte secret in the coordinator home,
:data:`KEY_FILE` (0600), created on the first checkpoint. A changed weight, accountant or optimiser
state, a checkpoint renamed to another round, copied from another federation or another home, or
one without a MAC is refused with :class:`~cuvil_edge.errors.CheckpointAuthenticationError` before
anything in it is parsed. HMAC rather than the coordinator's Ed25519 key in ``keys/``: only this
coordinator ever verifies a checkpoint (no third party needs a public key); the package key signs
what agents accept, so a second use would let one kind of signed bytes stand for the other; and
``keys rotate coordinator`` would orphan every checkpoint. The MAC does not stop a writer of the home
from deleting the newest checkpoints (a rollback): whoever can write the home holds its keys anyway.
Authenticated or not, non-finite weights or optimiser state are refused on resume
(:class:`~cuvil_edge.errors.NonFiniteCheckpointError`): a run that diverged must not ship NaN.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.federation import load_federation
from cuvil_edge.config.run_spec import RunSpec
from cuvil_edge.errors import (
    CheckpointAuthenticationError,
    CheckpointError,
    ConfigError,
    NonFiniteCheckpointError,
    StateError,
)
from cuvil_edge.private_dir import KEY_BYTES, load_or_create_key

_NAME = re.compile(r"^round-(\d{5})\.npz$")
#: The array holding the central-DP accountant's state (UTF-8 JSON); no weight may use this name.
ACCOUNTANT_KEY = "__central_dp_accountant__"
#: Arrays of the server optimiser's state: ``OPTIMISER_PREFIX + "<Flower class>/<slot>/<weight>"``.
OPTIMISER_PREFIX = "__server_optimiser__/"
#: The array holding the checkpoint's HMAC-SHA256 (32 bytes, uint8); no weight may use this name.
MAC_KEY = "__checkpoint_mac__"
#: The array holding the run's planned total rounds (an int64 scalar), so `--resume` runs the rest
#: of that plan; checkpoints written before it have none (the federation's ``rounds`` then).
PLANNED_KEY = "__planned_rounds__"
#: Array names no weight may use.
_RESERVED = (ACCOUNTANT_KEY, MAC_KEY, PLANNED_KEY)
#: The coordinator home's checkpoint MAC secret (32 random bytes, 0600), beside ``keys/`` rather than
#: in it: ``keys/*.key`` are Ed25519 keys (``keys rotate`` loads them all) and ``root.key`` may move offline.
KEY_FILE = "checkpoint-mac.key"
_MAC_DOMAIN = b"cuvil-edge checkpoint v1\0"
#: Array kinds a checkpoint holds: bool, signed and unsigned integers, floats, complex.
_PLAIN_KINDS = "biufc"
#: What to do about a checkpoint that cannot be used (every refusal names the file first).
_FIX = (
    "restore the original from backup; removing it resumes from the round before, but under central DP "
    "that forgets the releases made after it, so there start the federation afresh (a new --home or "
    "federation name)"
)


@dataclass(frozen=True)
class Checkpoint:
    round: int
    weights: dict[str, np.ndarray]
    path: Path
    accountant: dict | None = None  # Flower's RdpAccountant.state_dict() under central DP
    optimiser: dict[str, np.ndarray] = field(default_factory=dict)  # server_optimiser.optimiser_state()
    planned_rounds: int | None = None  # the run's total rounds; None in checkpoints that predate it


def checkpoint_dir(home: Path, federation: str) -> Path:
    return Path(home) / "checkpoints" / federation


def checkpoint_key_file(home: Path) -> Path:
    """The home's checkpoint MAC secret (created by the first :func:`save_checkpoint`)."""
    return Path(home) / KEY_FILE


def save_checkpoint(
    home: Path,
    federation: str,
    server_round: int,
    weights: Mapping[str, np.ndarray],
    accountant: dict | None = None,
    optimiser: Mapping[str, np.ndarray] | None = None,
    planned_rounds: int | None = None,
) -> Path:
    """Write the weights (and the central-DP ``accountant`` state, the server ``optimiser``'s, and
    the run's ``planned_rounds`` in all) after ``server_round``, with their MAC (atomic: a crash
    leaves the previous checkpoints).

    Raises:
        StateError: the checkpoint (or the home's checkpoint key) cannot be written, a weight's name
            is one checkpoints reserve (:data:`ACCOUNTANT_KEY`, :data:`MAC_KEY`, or starting with
            :data:`OPTIMISER_PREFIX`), or an array is not plain numbers.
    """
    reserved = [k for k in weights if k in _RESERVED or k.startswith(OPTIMISER_PREFIX)]
    if reserved:
        raise StateError(f"a weight is named {reserved[0]!r}, which checkpoints reserve; rename it in the model")
    arrays = {k: np.asarray(v) for k, v in weights.items()}
    arrays.update({OPTIMISER_PREFIX + k: np.asarray(v) for k, v in (optimiser or {}).items()})
    if accountant is not None:
        try:
            text = json.dumps(accountant, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise StateError(f"the central-DP accountant state cannot be checkpointed ({e})") from e
        arrays[ACCOUNTANT_KEY] = np.frombuffer(text.encode(), np.uint8)
    if planned_rounds is not None:
        arrays[PLANNED_KEY] = np.asarray(int(planned_rounds), np.int64)
    odd = [k for k, v in arrays.items() if v.dtype.kind not in _PLAIN_KINDS or v.dtype.fields is not None]
    if odd:
        raise StateError(
            f"checkpoint array {odd[0]!r} is {arrays[odd[0]].dtype}, not plain numbers; "
            "checkpoints hold numeric arrays only"
        )
    path = checkpoint_dir(home, federation) / f"round-{server_round:05d}.npz"
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = _checkpoint_key(home, path, create=True)
        arrays[MAC_KEY] = np.frombuffer(_mac(key, federation, server_round, arrays), np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub types ** as allow_pickle too
        atomic_write(path, buffer.getvalue(), mode=0o600)
    except OSError as e:
        raise StateError(f"cannot write checkpoint {path}: {e}") from e
    return path


def latest_checkpoint(home: Path, federation: str) -> Checkpoint | None:
    """The newest checkpoint of ``federation``, or None; authenticated, then checked.

    Raises:
        CheckpointAuthenticationError: it carries no MAC, or its MAC does not verify (changed, or
            from another home, federation or round), or the home has no checkpoint key.
        NonFiniteCheckpointError: a weight or optimiser array holds NaN or an infinite value.
        CheckpointError: it is unreadable (never silently skipped: resuming from an older one would
            repeat rounds).
    """
    folder = checkpoint_dir(home, federation)
    found = sorted((int(m.group(1)), p) for p in folder.glob("round-*.npz") if (m := _NAME.match(p.name)))
    if not found:
        return None
    server_round, path = found[-1]
    arrays = _read_arrays(path)
    _authenticate(home, federation, server_round, path, arrays)
    state = arrays.pop(ACCOUNTANT_KEY, None)
    planned = _planned(arrays.pop(PLANNED_KEY, None), server_round, path)
    optimiser = {k[len(OPTIMISER_PREFIX) :]: arrays.pop(k) for k in list(arrays) if k.startswith(OPTIMISER_PREFIX)}
    accountant = _accountant(state, path)
    _refuse_non_finite(path, arrays, "weight")
    _refuse_non_finite(path, optimiser, "server-optimiser array")
    return Checkpoint(server_round, arrays, path, accountant, optimiser, planned)


def _planned(value: np.ndarray | None, server_round: int, path: Path) -> int | None:
    """The planned total rounds a checkpoint records (an integer scalar, at least its round)."""
    if value is None:
        return None
    if value.shape != () or value.dtype.kind not in "iu" or int(value) < server_round:
        raise CheckpointError(
            f"checkpoint {path} is unreadable (its planned rounds {value!r} are not a number of "
            f"rounds of at least {server_round}); {_FIX}"
        )
    return int(value)


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of ``path``, plain numbers only (read once, so what is checked is what is used)."""
    try:
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as data:
            arrays = {k: np.array(data[k]) for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({e}); {_FIX}") from e
    odd = [k for k, v in arrays.items() if v.dtype.kind not in _PLAIN_KINDS or v.dtype.fields is not None]
    if odd:
        raise CheckpointError(
            f"checkpoint {path} is unreadable (array {odd[0]!r} is {arrays[odd[0]].dtype}, not plain numbers); {_FIX}"
        )
    return arrays


def _authenticate(home: Path, federation: str, server_round: int, path: Path, arrays: dict) -> None:
    """Check (and remove) the MAC of ``arrays``, the content of ``path``."""
    tag = arrays.pop(MAC_KEY, None)
    if tag is None:
        raise CheckpointAuthenticationError(
            f"checkpoint {path} carries no MAC, so nothing shows this coordinator wrote it (it predates "
            f"authenticated checkpoints, or was made elsewhere); {_FIX}"
        )
    key = _checkpoint_key(home, path, create=False)
    expected = _mac(key, federation, server_round, arrays)
    if tag.dtype != np.uint8 or tag.shape != (len(expected),) or not hmac.compare_digest(tag.tobytes(), expected):
        raise CheckpointAuthenticationError(
            f"checkpoint {path} does not authenticate under this home's checkpoint key {checkpoint_key_file(home)}: "
            f"it was changed after it was written, or copied from another home, federation or round; {_FIX}"
        )


def _mac(key: bytes, federation: str, server_round: int, arrays: Mapping[str, np.ndarray]) -> bytes:
    """HMAC-SHA256 over the federation, the round and each array (sorted by name): name, dtype,
    shape and C-order bytes, every part length-prefixed so no two contents encode alike."""
    mac = hmac.new(key, _MAC_DOMAIN, hashlib.sha256)

    def part(data) -> None:
        view = memoryview(data).cast("B")
        mac.update(len(view).to_bytes(8, "big"))
        mac.update(view)

    part(federation.encode("utf-8"))
    part(str(server_round).encode())
    part(str(len(arrays)).encode())
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        part(name.encode("utf-8"))
        part(array.dtype.str.encode())
        part(json.dumps(list(array.shape)).encode())
        part(array.reshape(-1).view(np.uint8))
    return mac.digest()


def _checkpoint_key(home: Path, checkpoint: Path, *, create: bool) -> bytes:
    """The home's checkpoint key; with ``create``, made first if the home has none.

    Raises:
        CheckpointAuthenticationError: there is none (and ``create`` is not set).
        StateError: it cannot be read, or is not a key.
        OSError: with ``create``, it cannot be written.
    """
    path = checkpoint_key_file(home)
    if create:  # made once, 0600, never replacing a concurrent writer's; refused unless private to us
        return load_or_create_key(path, what="the checkpoint key")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            key = f.read(KEY_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointAuthenticationError(
            f"checkpoint {checkpoint} cannot be authenticated: this home has no checkpoint key {path} (deleted, "
            "or the checkpoint was copied here from another home); restore the key from backup, or start the "
            "federation afresh (a new --home or federation name)"
        ) from None
    except OSError as e:
        raise StateError(f"cannot read the checkpoint key {path} ({e}); it must be a plain file (0600)") from e
    if len(key) != KEY_BYTES:
        raise StateError(
            f"{path} holds {len(key)} bytes, not a {KEY_BYTES}-byte checkpoint key; restore it "
            "from backup, or start the federation afresh (a new --home)"
        )
    return key


def _accountant(state: np.ndarray | None, path: Path) -> dict | None:
    """The accountant state's JSON object (no NaN, no infinity, no duplicate key)."""
    if state is None:
        return None
    try:
        if state.dtype != np.uint8 or state.ndim != 1:
            raise ValueError("the accountant state is not a byte string")
        doc = json.loads(state.tobytes().decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique)
        if not isinstance(doc, dict):
            raise ValueError("the accountant state is not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({e}); {_FIX}") from e
    return doc


def _no_constant(name: str) -> None:
    raise ValueError(f"the accountant state holds {name}, not a number")


def _unique(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"the accountant state names {sorted(k for k in keys if keys.count(k) > 1)[0]!r} twice")
    return dict(pairs)


def _refuse_non_finite(path: Path, arrays: Mapping[str, np.ndarray], what: str) -> None:
    for name in sorted(arrays):
        array = arrays[name]
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            count = int(array.size - np.count_nonzero(np.isfinite(array)))
            raise NonFiniteCheckpointError(
                f"checkpoint {path}: {what} {name!r} holds {count} NaN or infinite value(s), which a resumed run "
                "would sign and send to every site; the run diverged (lower the learning rate or clip updates); "
                f"{_FIX}"
            )


def resume_plan(home: Path, federation_path: Path | str, planned: int | None = None) -> tuple[int, int]:
    """(rounds done, rounds planned in all) of resuming the federation from its newest checkpoint in
    ``home``. The plan is ``planned`` (`--rounds`, the total) where given, else the one the
    checkpoint records (the interrupted run's), else (an older checkpoint) the federation's ``rounds``.

    Raises:
        ConfigError: there is no checkpoint, or every planned round is already done.
        StateError: the newest checkpoint is unreadable, not authentic
            (:class:`~cuvil_edge.errors.CheckpointAuthenticationError`) or not finite
            (:class:`~cuvil_edge.errors.NonFiniteCheckpointError`).
    """
    federation = load_federation(federation_path)
    last = latest_checkpoint(Path(home), federation.name)
    if last is None:
        raise ConfigError(f"nothing to resume: {home} has no checkpoint of federation {federation.name!r}")
    total = planned or last.planned_rounds or federation.rounds
    if last.round >= total:
        raise ConfigError(
            f"federation {federation.name!r} already completed {last.round} of {total} rounds; "
            "give more with --rounds TOTAL"
        )
    return last.round, total


def resumed(spec: RunSpec, planned: int | None = None) -> RunSpec:
    """``spec`` continued from its federation's newest checkpoint: the rounds left of the plan
    (:func:`resume_plan`; ``planned`` is `--rounds`, None where not given), numbered on.

    Raises:
        ConfigError / StateError: see :func:`resume_plan`.
    """
    done, total = resume_plan(Path(spec.home), spec.federation, planned)
    return replace(spec, rounds=total - done, start_round=done)
