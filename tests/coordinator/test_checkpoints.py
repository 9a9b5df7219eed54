"""Checkpoints of the global model per round, and resuming from the newest one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.coordinator.checkpoints import latest_checkpoint, resumed, save_checkpoint
from cuvil_edge.coordinator.launcher import prepare_run
from cuvil_edge.errors import ConfigError, StateError

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
        resumed(spec)
    save_checkpoint(tmp_path / "home", "digits-demo", 3, {"w": np.ones(1)})
    again = resumed(spec)
    assert (again.start_round, again.rounds) == (3, 2)
    save_checkpoint(tmp_path / "home", "digits-demo", 5, {"w": np.ones(1)})
    with pytest.raises(ConfigError, match="already completed"):
        resumed(spec)


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
    from cuvil_edge.coordinator.checkpoints import ACCOUNTANT_KEY

    state = {"schema_version": 1, "compositions": [{"event": {"noise_multiplier": 1.0}, "count": 2}]}
    save_checkpoint(tmp_path, "f", 1, {"w": np.ones(2, np.float32)}, accountant=state)
    last = latest_checkpoint(tmp_path, "f")
    assert last.accountant == state and set(last.weights) == {"w"}
    save_checkpoint(tmp_path, "f", 2, {"w": np.ones(2, np.float32)})
    assert latest_checkpoint(tmp_path, "f").accountant is None
    with pytest.raises(StateError, match="reserve"):
        save_checkpoint(tmp_path, "f", 3, {ACCOUNTANT_KEY: np.ones(1)})
    path = tmp_path / "checkpoints" / "f" / "round-00004.npz"
    np.savez(path, w=np.ones(2), **{ACCOUNTANT_KEY: np.frombuffer(b"[1, 2]", np.uint8)})
    with pytest.raises(StateError, match="round-00004.npz is unreadable.*not a JSON object"):
        latest_checkpoint(tmp_path, "f")
