"""The site state directory is private to the agent's user: created 0700,
`agent init` tightens an open one of ours, and the agent refuses one (or an entry in it) that is
open to group or others, another user's, or a symbolic link -- one named test per attack."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from cuvil_edge.agent.enroll import init_site
from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.config import load_site
from cuvil_edge.coordinator.keys import init_keys
from cuvil_edge.errors import StateError, UnsafePathError

SITES = Path(__file__).resolve().parents[2] / "configs" / "sites"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def site():
    return load_site(SITES / "fleet-c.yaml")


@pytest.fixture
def root_json(tmp_path):
    _, public = init_keys(tmp_path / "keys")
    return public


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _state(tmp_path: Path, site) -> Path:
    """Where `agent init --home <tmp_path>/home` puts the site's state (no agent.state_dir in the YAML)."""
    assert site.agent.state_dir is None
    return tmp_path / "home" / "agents" / site.site


# --- agent init --------------------------------------------------------------------------------------
def test_agent_init_creates_the_state_dir_and_its_missing_parents_0700(tmp_path, site, root_json):
    setup = init_site(site, root_json, home=tmp_path / "home")
    assert setup.state_dir == _state(tmp_path, site)
    assert [_mode(p) for p in (setup.state_dir, setup.state_dir.parent, tmp_path / "home")] == [0o700] * 3


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o755], ids=lambda m: f"{m:04o}")
def test_agent_init_tightens_an_open_state_dir(tmp_path, site, root_json, mode):
    state = _state(tmp_path, site)
    state.mkdir(parents=True)
    os.chmod(state, mode)
    setup = init_site(site, root_json, home=tmp_path / "home")
    assert setup.state_dir == state and _mode(state) == 0o700
    AgentRuntime(site, state, None)  # and the agent takes it


@needs_root
def test_agent_init_refuses_a_foreign_owned_state_dir(tmp_path, site, root_json):
    state = _state(tmp_path, site)
    state.mkdir(parents=True)
    os.chmod(state, 0o777)
    os.chown(state, 12345, -1)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(state))} is owned by uid 12345.*chown -R"):
        init_site(site, root_json, home=tmp_path / "home")
    assert _mode(state) == 0o777 and list(state.iterdir()) == []  # neither changed nor written to


def test_agent_init_refuses_a_symlinked_state_dir(tmp_path, site, root_json):
    state, real = _state(tmp_path, site), tmp_path / "real"
    real.mkdir(mode=0o700)
    state.parent.mkdir(parents=True)
    state.symlink_to(real)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(state))} is a symbolic link"):
        init_site(site, root_json, home=tmp_path / "home")
    assert list(real.iterdir()) == []


# --- the agent ---------------------------------------------------------------------------------------
def test_agent_creates_its_state_dir_0700(tmp_path, site, root_json):
    AgentRuntime(site, tmp_path / "new" / "state", root_json)
    assert _mode(tmp_path / "new" / "state") == _mode(tmp_path / "new") == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=lambda m: f"{m:04o}")
def test_agent_refuses_a_group_or_other_writable_state_dir(tmp_path, site, root_json, mode):
    state = tmp_path / "state"
    AgentRuntime(site, state, root_json)
    os.chmod(state, mode)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(state))} is writable by group or others.*chmod 700"):
        AgentRuntime(site, state, None)
    assert _mode(state) == mode  # the agent does not change it; `agent init` or the operator does


@pytest.mark.parametrize("entry", ["anti_rollback.json", "packages"])
def test_agent_refuses_a_group_writable_entry_of_its_state_dir(tmp_path, site, root_json, entry):
    state = tmp_path / "state"
    AgentRuntime(site, state, root_json)
    (state / "packages").mkdir(mode=0o700)
    os.chmod(state / entry, 0o666 if entry.endswith(".json") else 0o777)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(state / entry))} is writable by group or others"):
        AgentRuntime(site, state, None)


@needs_root
@pytest.mark.parametrize("entry", ["", "anti_rollback.json"])
def test_agent_refuses_a_foreign_owned_state_dir_or_entry(tmp_path, site, root_json, entry):
    state = tmp_path / "state"
    AgentRuntime(site, state, root_json)
    os.chown(state / entry, 12345, -1)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(state / entry))} is owned by uid 12345"):
        AgentRuntime(site, state, None)


def test_agent_refuses_a_symlinked_entry_of_its_state_dir(tmp_path, site, root_json):
    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    AgentRuntime(site, state, root_json)
    elsewhere.mkdir(mode=0o700)
    (state / "build-cache").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(state / 'build-cache'))} is a symbolic link"):
        AgentRuntime(site, state, None)


def test_an_unsafe_state_dir_is_a_state_error_whose_message_never_says_remove_it(tmp_path, site, root_json):
    """The state holds the site's keys and ledger: the fix offered is chmod, never rm."""
    state = tmp_path / "state"
    AgentRuntime(site, state, root_json)
    os.chmod(state, 0o777)
    with pytest.raises(StateError) as caught:
        AgentRuntime(site, state, None)
    assert "rm " not in str(caught.value) and "remove" not in str(caught.value)
