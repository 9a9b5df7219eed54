"""The durable anti-rollback state (PACKAGE_SPEC §11) through the one entry point, verify_and_accept."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
from conftest import ISSUED, SITE, accept_kwargs, make_package, open_state

from cuvil_edge.errors import DigestConflictError, ReleaseRollbackError, RollbackError, StateError
from cuvil_edge.ir_serialize import AntiRollbackState, verify_and_accept
from cuvil_edge.ir_serialize.state import STATE_FILE


def _accept(state, pkg, **over):
    return verify_and_accept(pkg, state, **accept_kwargs(**over))


def _doc(**over) -> bytes:
    doc = {"format": 2, "root": None, "revoked": [], "time_floor": 0, "sites": {}, "releases": {}}
    doc.update(over)
    return json.dumps(doc).encode()


def test_state_must_be_initialised_before_anything_is_accepted(tmp_path, graph, keys):
    with pytest.raises(StateError, match="agent init"):
        _accept(AntiRollbackState(tmp_path), make_package(graph, keys))
    assert not (tmp_path / STATE_FILE).exists()


def test_initialise_happens_once_and_the_stored_root_wins(tmp_path, keys, trust):
    from conftest import make_trust

    state = open_state(tmp_path, trust, None)
    other = make_trust(keys, version=7)[1]
    assert state.initialise(other).version == 1  # the pinned file is only a bootstrap (§10.2)
    assert AntiRollbackState(tmp_path).trust_root().version == 1


def test_accepted_package_says_which_root_and_state_checked_it(tmp_path, graph, keys, trust):
    state = open_state(tmp_path, trust, None)
    v = _accept(state, make_package(graph, keys))
    assert (v.root_version, v.state) == (1, state.path)
    assert AntiRollbackState(tmp_path).last_accepted(SITE).version == 5


def test_state_file_is_private_and_no_temp_file_left(tmp_path, graph, keys, trust):
    state = open_state(tmp_path / "s", trust, None)
    _accept(state, make_package(graph, keys, version=1))
    _accept(state, make_package(graph, keys, version=2))
    assert stat.S_IMODE(os.stat(state.path).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path / "s")) == ["anti_rollback.json", "anti_rollback.lock"]


def test_older_version_and_equal_version_with_other_digest_refused(tmp_path, graph, keys, trust):
    state = open_state(tmp_path, trust, None)
    first = make_package(graph, keys, version=3)
    _accept(state, first)
    _accept(state, first)  # idempotent re-delivery
    with pytest.raises(RollbackError):
        _accept(state, make_package(graph, keys, version=2))
    with pytest.raises(DigestConflictError):
        _accept(state, make_package(graph, keys, version=3, nonce="other"))
    assert state.last_accepted(SITE).version == 3


def test_release_counter_and_time_floor_recorded(tmp_path, graph, keys, trust):
    state = open_state(tmp_path, trust, None)
    _accept(state, make_package(graph, keys, version=1, release_counter=4))
    snap = state.snapshot()
    assert snap.releases == {"model": 4} and snap.time_floor == ISSUED  # min(issued_at, now)
    with pytest.raises(ReleaseRollbackError):
        _accept(state, make_package(graph, keys, version=2, release_counter=3))


def test_leftover_temp_file_of_a_killed_writer_removed_on_open(tmp_path, graph, keys, trust):
    state = open_state(tmp_path, trust, None)
    _accept(state, make_package(graph, keys))
    before = state.path.read_bytes()
    leftover = tmp_path / f".{STATE_FILE}.k1ll3d.tmp"
    leftover.write_bytes(before[: len(before) // 2])  # a writer killed between write and rename
    reopened = AntiRollbackState(tmp_path)
    assert not leftover.exists() and reopened.path.read_bytes() == before
    assert reopened.last_accepted(SITE).version == 5


def test_crash_between_temp_write_and_rename_keeps_old_state(tmp_path, graph, keys, trust, monkeypatch):
    state = open_state(tmp_path, trust, None)
    _accept(state, make_package(graph, keys, version=1))
    before = state.path.read_bytes()

    def crash(*_):
        raise OSError("killed before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StateError):
        _accept(state, make_package(graph, keys, version=2))
    monkeypatch.undo()
    assert state.path.read_bytes() == before and AntiRollbackState(tmp_path).last_accepted(SITE).version == 1


def test_concurrent_deliveries_never_move_the_floor_back(tmp_path, graph, keys, trust):
    """Eight threads deliver versions 1..8 at once: with the lock, the result is always 8."""
    packages = [make_package(graph, keys, version=v) for v in range(1, 9)]
    for attempt in range(3):
        state = open_state(tmp_path / f"run{attempt}", trust, None)
        barrier = threading.Barrier(len(packages))

        def deliver(pkg):
            barrier.wait()
            try:
                _accept(state, pkg)
            except RollbackError:
                pass  # a newer version won the race: refusing the older one is right

        threads = [threading.Thread(target=deliver, args=(p,)) for p in packages]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert state.last_accepted(SITE).version == 8


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", _doc(sites={"a": {"version": 1}}), _doc().replace(b'"format": 2', b'"format": 2, "format": 2'),
     _doc(sites={"a": {"version": True, "digest": "0" * 64}}), _doc(format=3), _doc(extra=0), b"\xff\xfe",
     _doc(root={"payload": "", "payloadType": "x", "signatures": []}), b"[" * 5000 + b"]" * 5000,
     _doc(sites={"a\u202eb": {"version": 1, "digest": "0" * 64}})],
    ids=["empty", "garbage", "missing-digest", "duplicate-key", "bool-version", "future-format", "unknown-field",
         "bad-utf8", "bad-root", "deep-nesting", "bidi-site-name"],
)
def test_corrupt_state_file_raises_state_error_and_is_kept(tmp_path, graph, keys, content):
    (tmp_path / STATE_FILE).write_bytes(content)
    state = AntiRollbackState(tmp_path)
    with pytest.raises(StateError, match="never reset"):
        state.snapshot()
    with pytest.raises(StateError):
        _accept(state, make_package(graph, keys))
    assert (tmp_path / STATE_FILE).read_bytes() == content  # not silently reset
