"""Checkpoints of the global model per round, and resuming from the newest one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.coordinator.checkpoints import (
    ACCOUNTANT_KEY, KEY_FILE, MAC_KEY, OPTIMISER_PREFIX, latest_checkpoint, resumed, save_checkpoint,
)
from cuvil_edge.coordinator.launcher import prepare_run
from cuvil_edge.errors import (
    CheckpointAuthenticationError, CheckpointError, ConfigError, NonFiniteCheckpointError, StateError,
)

ROOT = Path(__file__).resolve().parents[2]
FED = ROOT / "configs" / "federation.yaml"


def test_newest_checkpoint_round_trips_exactly(tmp_path):
    for r in (1, 2, 10):
        save_checkpoint(tmp_path, "digits-demo", r, {"w": np.full((2, 3), r, np.float32), "b": np.arange(3.0)})
    last = latest_checkpoint(tmp_path, "digits-demo")
    assert last.round == 10 and last.weights["w"].dtype == np.float32
    np.testing.assert_array_equal(last.weights["w"], np.full((2, 3), 10, np.float32))
    assert latest_checkpoint(tmp_path, "other") is None


@pytest.mark.parametrize("content", [b"", b"not a zip", None], ids=["empty", "garbage", "pickled-object"])
def test_an_unreadable_newest_checkpoint_stops_the_resume(tmp_path, content):
    save_checkpoint(tmp_path, "f", 1, {"w": np.ones(2)})
    path = tmp_path / "checkpoints" / "f" / "round-00002.npz"
    if content is None:
        np.savez(path, w=np.array([{"evil": 1}], dtype=object))  # must never be unpickled
    else:
        path.write_bytes(content)
    with pytest.raises(StateError, match="round-00002"):
        latest_checkpoint(tmp_path, "f")


def test_resume_continues_with_the_rounds_left(tmp_path):
    spec = prepare_run(FED, tmp_path / "run", rounds=5, home=tmp_path / "home")
    with pytest.raises(ConfigError, match="nothing to resume"):
        resumed(spec, 5)
    save_checkpoint(tmp_path / "home", "digits-demo", 3, {"w": np.ones(1)})
    again = resumed(spec, 5)  # --rounds 5: the total, rounds done included
    assert (again.start_round, again.rounds) == (3, 2)
    save_checkpoint(tmp_path / "home", "digits-demo", 5, {"w": np.ones(1)})
    with pytest.raises(ConfigError, match="already completed 5 of 5"):
        resumed(spec, 5)


def test_resume_without_rounds_does_the_rest_of_the_interrupted_runs_plan(tmp_path):
    """A run of 5 planned rounds stopped after round 3: --resume runs rounds 4 and 5, not the
    federation's 20 again; a checkpoint from before plans were recorded falls back to those 20."""
    home = tmp_path / "home"
    spec = prepare_run(FED, tmp_path / "run", home=home)  # no --rounds
    save_checkpoint(home, "digits-demo", 3, {"w": np.ones(1)}, planned_rounds=5)
    assert latest_checkpoint(home, "digits-demo").planned_rounds == 5
    assert (resumed(spec).start_round, resumed(spec).rounds) == (3, 2)
    assert resumed(spec, 8).rounds == 5  # --rounds 8 replaces the plan
    save_checkpoint(home, "digits-demo", 4, {"w": np.ones(1)})  # an older checkpoint: no plan in it
    assert latest_checkpoint(home, "digits-demo").planned_rounds is None
    assert (resumed(spec).start_round, resumed(spec).rounds) == (4, 16)
    save_checkpoint(home, "digits-demo", 5, {"w": np.ones(1)}, planned_rounds=5)
    with pytest.raises(ConfigError, match="already completed 5 of 5 rounds; give more with --rounds"):
        resumed(spec)
    assert prepare_run(FED, tmp_path / "run2", home=home, resume=True, rounds=7).rounds == 2


def test_the_planned_rounds_are_authenticated(tmp_path):
    save_checkpoint(tmp_path, "f", 3, {"w": np.ones(2)}, planned_rounds=5)
    path = tmp_path / "checkpoints" / "f" / "round-00003.npz"
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["__planned_rounds__"] = np.asarray(50, np.int64)  # a longer plan, without the key
    np.savez(path, **arrays)
    with pytest.raises(CheckpointAuthenticationError):
        latest_checkpoint(tmp_path, "f")
    with pytest.raises(StateError, match="reserve"):
        save_checkpoint(tmp_path, "f", 4, {"__planned_rounds__": np.ones(1)})


def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path, monkeypatch):
    import os

    save_checkpoint(tmp_path, "f", 1, {"w": np.ones(2)})

    def crash(*_):
        raise OSError("killed before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StateError):
        save_checkpoint(tmp_path, "f", 2, {"w": np.zeros(2)})
    monkeypatch.undo()
    last = latest_checkpoint(tmp_path, "f")
    assert last.round == 1 and [p.name for p in (tmp_path / "checkpoints" / "f").iterdir()] == ["round-00001.npz"]


def test_the_central_dp_accountant_travels_with_the_weights_in_one_file(tmp_path):
    state = {"schema_version": 1, "compositions": [{"event": {"noise_multiplier": 1.0}, "count": 2}]}
    save_checkpoint(tmp_path, "f", 1, {"w": np.ones(2, np.float32)}, accountant=state)
    last = latest_checkpoint(tmp_path, "f")
    assert last.accountant == state and set(last.weights) == {"w"}
    save_checkpoint(tmp_path, "f", 2, {"w": np.ones(2, np.float32)})
    assert latest_checkpoint(tmp_path, "f").accountant is None
    with pytest.raises(StateError, match="reserve"):
        save_checkpoint(tmp_path, "f", 3, {ACCOUNTANT_KEY: np.ones(1)})
    save_checkpoint(tmp_path, "f", 4, {"w": np.ones(2)}, accountant=[1, 2])  # authentic, but not an object
    with pytest.raises(StateError, match="round-00004.npz is unreadable.*not a JSON object"):
        latest_checkpoint(tmp_path, "f")


# --- attacks on a resume: one test each -----------------------------------------
ACCOUNTANT = {"schema_version": 1, "config": {"target_delta": 1e-5, "max_epsilon": 8.0},
              "compositions": [{"event": {"noise_multiplier": 1.0}, "count": 2}]}


def _a_central_dp_checkpoint(home: Path, federation: str = "digits-demo", server_round: int = 2) -> Path:
    """What the ServerApp writes under central DP with FedAdam: weights, accountant, optimiser."""
    return save_checkpoint(home, federation, server_round, {"conv.w": np.full((2, 3), 0.5, np.float32),
                                                            "fc.b": np.arange(3, dtype=np.float32)},
                           accountant=ACCOUNTANT, optimiser={"FedAdam/m_t/fc.b": np.zeros(3, np.float32),
                                                             "FedAdam/v_t/fc.b": np.ones(3, np.float32)})


def _rewrite(path: Path, change) -> None:
    """Load every array of the checkpoint (its MAC included), let ``change`` edit them, save again:
    what someone who can write the home, but does not hold its key, can do."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: np.array(data[k]) for k in data.files}
    change(arrays)
    np.savez(path, **arrays)


def test_a_checkpoint_round_trips_weights_accountant_and_optimiser_with_a_mac(tmp_path):
    path = _a_central_dp_checkpoint(tmp_path)
    with np.load(path, allow_pickle=False) as data:
        assert MAC_KEY in data.files and data[MAC_KEY].shape == (32,)
    key = tmp_path / KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    last = latest_checkpoint(tmp_path, "digits-demo")
    assert last.accountant == ACCOUNTANT and set(last.weights) == {"conv.w", "fc.b"}
    assert set(last.optimiser) == {"FedAdam/m_t/fc.b", "FedAdam/v_t/fc.b"}
    _a_central_dp_checkpoint(tmp_path, server_round=3)  # the second checkpoint keeps the home's key
    assert latest_checkpoint(tmp_path, "digits-demo").round == 3 and len(key.read_bytes()) == 32


def test_resume_refuses_nan_weights(tmp_path):
    spec = prepare_run(FED, tmp_path / "run", rounds=5, home=tmp_path / "home")
    weights = {"conv.w": np.ones((2, 2), np.float32), "fc.b": np.array([0.0, np.nan, 1.0], np.float32)}
    save_checkpoint(tmp_path / "home", "digits-demo", 3, weights)  # authentic: the coordinator's own diverged run
    with pytest.raises(NonFiniteCheckpointError, match=r"round-00003\.npz: weight 'fc.b' holds 1 NaN"):
        resumed(spec)
    with pytest.raises(NonFiniteCheckpointError, match=r"round-00003\.npz"):
        prepare_run(FED, tmp_path / "run2", rounds=5, home=tmp_path / "home", resume=True)  # `run --resume`


@pytest.mark.parametrize("bad", [np.inf, -np.inf], ids=["inf", "-inf"])
def test_resume_refuses_infinite_weights_and_optimiser_state(tmp_path, bad):
    save_checkpoint(tmp_path, "f", 1, {"w": np.array([1.0, bad])})
    with pytest.raises(NonFiniteCheckpointError, match=r"round-00001\.npz: weight 'w' holds 1 NaN or infinite"):
        latest_checkpoint(tmp_path, "f")
    save_checkpoint(tmp_path, "f", 2, {"w": np.ones(2)}, optimiser={"FedAdam/v_t/w": np.array([bad, 0.0])})
    with pytest.raises(NonFiniteCheckpointError, match=r"server-optimiser array 'FedAdam/v_t/w'"):
        latest_checkpoint(tmp_path, "f")


def test_tampered_checkpoint_weight_is_refused(tmp_path):
    path = _a_central_dp_checkpoint(tmp_path)

    def change(arrays):
        arrays["conv.w"][0, 0] = 0.25  # one weight, one value
    _rewrite(path, change)
    with pytest.raises(CheckpointAuthenticationError, match=r"round-00002\.npz does not authenticate.*"
                                                            r"restore the original from backup"):
        latest_checkpoint(tmp_path, "digits-demo")


@pytest.mark.parametrize("attack", ["added weight", "removed weight", "renamed weight", "retyped weight",
                                    "reshaped weight"])
def test_tampered_checkpoint_structure_is_refused(tmp_path, attack):
    path = _a_central_dp_checkpoint(tmp_path)

    def change(arrays):
        if attack == "added weight":
            arrays["extra"] = np.zeros(1, np.float32)
        elif attack == "removed weight":
            del arrays["fc.b"]
        elif attack == "renamed weight":
            arrays["fc.bias"] = arrays.pop("fc.b")
        elif attack == "retyped weight":
            arrays["fc.b"] = arrays["fc.b"].view(np.int32)  # the same bytes, another dtype
        else:
            arrays["conv.w"] = arrays["conv.w"].reshape(3, 2)  # the same bytes, another shape
    _rewrite(path, change)
    with pytest.raises(CheckpointAuthenticationError, match="round-00002.npz does not authenticate"):
        latest_checkpoint(tmp_path, "digits-demo")


def test_tampered_accountant_state_is_refused(tmp_path):
    path = _a_central_dp_checkpoint(tmp_path)
    forgetful = {**ACCOUNTANT, "compositions": []}  # "no release so far": ε would count from zero

    def change(arrays):
        arrays[ACCOUNTANT_KEY] = np.frombuffer(json.dumps(forgetful, sort_keys=True).encode(), np.uint8)
    _rewrite(path, change)
    with pytest.raises(CheckpointAuthenticationError, match="round-00002.npz does not authenticate"):
        latest_checkpoint(tmp_path, "digits-demo")


def test_removed_accountant_state_is_refused(tmp_path):
    path = _a_central_dp_checkpoint(tmp_path)
    _rewrite(path, lambda arrays: arrays.pop(ACCOUNTANT_KEY))
    with pytest.raises(CheckpointAuthenticationError, match="round-00002.npz does not authenticate"):
        latest_checkpoint(tmp_path, "digits-demo")


def test_tampered_optimiser_state_is_refused(tmp_path):
    path = _a_central_dp_checkpoint(tmp_path)

    def change(arrays):
        arrays[OPTIMISER_PREFIX + "FedAdam/v_t/fc.b"] = np.full(3, 1e-12, np.float32)  # huge Adam steps
    _rewrite(path, change)
    with pytest.raises(CheckpointAuthenticationError, match="round-00002.npz does not authenticate"):
        latest_checkpoint(tmp_path, "digits-demo")


def test_checkpoint_without_a_mac_is_refused(tmp_path):
    path = _a_central_dp_checkpoint(tmp_path)
    _rewrite(path, lambda arrays: arrays.pop(MAC_KEY))
    with pytest.raises(CheckpointAuthenticationError, match="round-00002.npz carries no MAC"):
        latest_checkpoint(tmp_path, "digits-demo")
    np.savez(path, w=np.ones(2))  # a checkpoint as older versions wrote them, without a MAC
    with pytest.raises(CheckpointAuthenticationError, match="carries no MAC"):
        latest_checkpoint(tmp_path, "digits-demo")


def test_checkpoint_from_another_home_is_refused(tmp_path):
    theirs = _a_central_dp_checkpoint(tmp_path / "other-home", server_round=5)
    _a_central_dp_checkpoint(tmp_path / "home", server_round=4)
    ours = tmp_path / "home" / "checkpoints" / "digits-demo" / "round-00005.npz"
    shutil.copy(theirs, ours)  # same federation name and round, another coordinator's key
    with pytest.raises(CheckpointAuthenticationError, match=r"round-00005\.npz does not authenticate.*"
                                                            r"another home"):
        latest_checkpoint(tmp_path / "home", "digits-demo")
    fresh = tmp_path / "fresh-home" / "checkpoints" / "digits-demo"
    fresh.mkdir(parents=True)
    shutil.copy(theirs, fresh / "round-00005.npz")  # a home that never wrote a checkpoint has no key
    with pytest.raises(CheckpointAuthenticationError, match=r"round-00005\.npz cannot be authenticated: "
                                                            r"this home has no checkpoint key"):
        latest_checkpoint(tmp_path / "fresh-home", "digits-demo")


def test_checkpoint_from_another_federation_or_round_is_refused(tmp_path):
    theirs = _a_central_dp_checkpoint(tmp_path, federation="other-federation", server_round=3)
    ours = tmp_path / "checkpoints" / "digits-demo"
    ours.mkdir(parents=True)
    shutil.copy(theirs, ours / "round-00003.npz")  # same home (same key), another federation
    with pytest.raises(CheckpointAuthenticationError, match="round-00003.npz does not authenticate"):
        latest_checkpoint(tmp_path, "digits-demo")
    (ours / "round-00003.npz").unlink()
    shutil.copy(theirs, tmp_path / "checkpoints" / "other-federation" / "round-00009.npz")  # renumbered
    with pytest.raises(CheckpointAuthenticationError, match="round-00009.npz does not authenticate"):
        latest_checkpoint(tmp_path, "other-federation")


@pytest.mark.parametrize("key", [b"", b"short", b"k" * 33], ids=["empty", "short", "long"])
def test_a_damaged_checkpoint_key_is_a_state_error_naming_it(tmp_path, key):
    _a_central_dp_checkpoint(tmp_path)
    (tmp_path / KEY_FILE).write_bytes(key)
    with pytest.raises(StateError, match=KEY_FILE):
        latest_checkpoint(tmp_path, "digits-demo")
    with pytest.raises(StateError, match=KEY_FILE):
        _a_central_dp_checkpoint(tmp_path, server_round=3)  # never silently replaced by a new key


@pytest.mark.parametrize("text", [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": 1, "a": 2}'],
                         ids=["nan", "infinity", "duplicate-key"])
def test_an_accountant_state_with_non_numbers_or_duplicate_keys_is_refused(tmp_path, text):
    """Even with a valid MAC (resealed here with the home's own key): never parsed leniently."""
    from cuvil_edge.coordinator.checkpoints import _mac

    path = save_checkpoint(tmp_path, "f", 1, {"w": np.ones(2)}, accountant={"a": 1})

    def change(arrays):
        arrays[ACCOUNTANT_KEY] = np.frombuffer(text, np.uint8)
        del arrays[MAC_KEY]
        arrays[MAC_KEY] = np.frombuffer(_mac((tmp_path / KEY_FILE).read_bytes(), "f", 1, arrays), np.uint8)
    _rewrite(path, change)
    with pytest.raises(CheckpointError, match="round-00001.npz is unreadable"):
        latest_checkpoint(tmp_path, "f")


def test_an_unauthenticated_checkpoint_is_refused_before_any_of_it_is_parsed(tmp_path):
    path = _a_central_dp_checkpoint(tmp_path)
    _rewrite(path, lambda arrays: arrays.__setitem__(ACCOUNTANT_KEY, np.frombuffer(b"\xff\xfe", np.uint8)))
    with pytest.raises(CheckpointAuthenticationError):  # not a UnicodeDecodeError from parsing it first
        latest_checkpoint(tmp_path, "digits-demo")
