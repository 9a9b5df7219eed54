"""Key management from the command line: init, show, rotate, revoke, and the agent's sealing keys.

A rotation is checked end to end: an agent pinned to root v1 accepts a package
signed with the rotated coordinator key (the package carries root v2), and a
package signed with the retired key is refused afterwards.
"""

import shutil
from pathlib import Path

import pytest

from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.cli.main import main
from cuvil_edge.config import load_site
from cuvil_edge.errors import PackageError
from cuvil_edge.frontend.demo_model import digits_cnn_onnx

SITE = Path(__file__).resolve().parents[2] / "configs" / "sites" / "factory-b.yaml"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx").write_bytes(digits_cnn_onnx(0))
    assert main(["keys", "init", "--dir", "k"]) == 0
    return tmp_path


def compile_to(name: str) -> None:
    assert main(["compile", "model.onnx", "--site", str(SITE), "-o", name, "--key", "k/coordinator.key"]) == 0


def test_init_writes_private_keys_owner_only(workdir):
    for name in ("root.key", "release.key", "coordinator.key"):
        assert (workdir / "k" / name).stat().st_mode & 0o077 == 0, name
    assert (workdir / "k" / "root.json").is_file()


def test_show_lists_version_and_roles(workdir, capsys):
    capsys.readouterr()
    assert main(["keys", "show", "--dir", "k"]) == 0
    out = capsys.readouterr().out
    assert "version 1" in out
    for role in ("root", "release", "coordinator"):
        assert role in out


def test_rotation_is_followed_by_an_agent_pinned_to_the_old_root(workdir, capsys):
    shutil.copy(workdir / "k" / "root.json", workdir / "pinned-root.json")  # what the agent shipped with
    compile_to("old.cpkg")
    old_package = (workdir / "old.cpkg").read_bytes()
    assert main(["keys", "rotate", "coordinator", "--dir", "k"]) == 0
    assert main(["keys", "show", "--dir", "k"]) == 0
    assert "version 2" in capsys.readouterr().out
    compile_to("new.cpkg")

    agent = AgentRuntime(load_site(SITE), workdir / "state", workdir / "pinned-root.json")
    activated = agent.activate((workdir / "new.cpkg").read_bytes())
    assert activated.package.manifest.site == "factory-b"
    with pytest.raises(PackageError):  # signed by the retired coordinator key, and older
        agent.activate(old_package)


def test_revoke_unknown_key_is_a_one_line_error(workdir, capsys):
    assert main(["keys", "revoke", "0" * 64, "--dir", "k"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_agent_sealing_keys(workdir, capsys):
    assert main(["agent", "keys", "init", "--dir", "a"]) == 0
    assert (workdir / "a" / "seal.key").stat().st_mode & 0o077 == 0
    assert (workdir / "a" / "seal.pub").is_file()
    capsys.readouterr()
    assert main(["agent", "keys", "init", "--dir", "a"]) == 2
    assert "--force" in capsys.readouterr().err
