"""`cuvil-edge runs`, `stop` and `run` without a SuperLink: one line saying what is missing, exit 2,
never a traceback, a false "no runs" or a run submitted to nothing. The e2e deployment test lists
and stops runs on a real one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cuvil_edge.cli.main import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FEDERATION = Path(__file__).resolve().parents[2] / "configs" / "federation.yaml"


def test_a_home_without_a_superlink_says_how_to_start_one(tmp_path, capsys):
    for command in (["runs"], ["stop", "3"], ["run", "--federation", str(FEDERATION)]):
        assert main([*command, "--home", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "coordinator serve" in err


def test_a_superlink_that_is_down_is_named_not_reachable(tmp_path, capsys):
    """`flwr ls` exits 0 with ``{"success": false}`` when nothing listens; that is an error here."""
    (tmp_path / "flwr").mkdir()
    (tmp_path / "flwr" / "config.toml").write_text(
        f'[superlink]\ndefault = "cuvil"\n\n[superlink.cuvil]\naddress = "127.0.0.1:{_free_port()}"\n'
        'insecure = true\n')
    for command in (["runs"], ["run", "--federation", str(FEDERATION)]):
        assert main([*command, "--home", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "did not answer" in err and "unavailable" in err


def _home_with_superlink(tmp_path: Path, enrolled: list[str]) -> Path:
    import json

    (tmp_path / "flwr").mkdir()
    (tmp_path / "flwr" / "config.toml").write_text('[superlink]\ndefault = "cuvil"\n')
    (tmp_path / "sites.json").write_text(json.dumps({"format": 1, "sites": {s: {"node_id": "1"} for s in enrolled}}))
    return tmp_path


def test_run_refuses_a_listed_site_that_is_not_enrolled_before_submitting(tmp_path, monkeypatch, capsys):
    from cuvil_edge.coordinator import preflight, superlink

    home = _home_with_superlink(tmp_path, ["hospital-a", "fleet-c"])
    monkeypatch.setattr(preflight, "online_sites", lambda home, registry: set(registry))
    monkeypatch.setattr(superlink, "submit_run", lambda *a, **k: pytest.fail("submitted"))
    assert main(["run", "--federation", str(FEDERATION), "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "factory-b" in err and str(FEDERATION.parent / "sites" / "factory-b.yaml") in err
    assert "cuvil-edge coordinator enroll" in err and "sites:" in err


def test_run_that_fails_exits_1_with_the_serverapps_reason_on_one_line(tmp_path, monkeypatch, capsys):
    from cuvil_edge.coordinator import preflight, superlink

    def failed(*a, **k):
        raise superlink.RunEndedError("the run ended as 'finished:failed': no site trained in any round: "
                                      "hospital-a: PACKAGE_REJECTED", "finished:failed", "no site trained ...")

    monkeypatch.setattr(preflight, "wait_for_sites", lambda *a, **k: ())
    monkeypatch.setattr(superlink, "submit_run", failed)
    assert main(["run", "--federation", str(FEDERATION), "--home", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == ("error: the run ended as 'finished:failed': no site trained in any round: "
                   "hospital-a: PACKAGE_REJECTED\n")


def test_run_resume_says_what_is_left_and_refuses_when_nothing_is(tmp_path, monkeypatch, capsys):
    import numpy as np

    from cuvil_edge.coordinator import preflight, superlink
    from cuvil_edge.coordinator.checkpoints import save_checkpoint

    submitted = []
    monkeypatch.setattr(preflight, "wait_for_sites", lambda *a, **k: ())
    monkeypatch.setattr(superlink, "submit_run", lambda *a, **k: submitted.append(k) or "finished:completed")
    assert main(["run", "--federation", str(FEDERATION), "--home", str(tmp_path), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err and not submitted
    save_checkpoint(tmp_path, "digits-demo", 3, {"w": np.ones(1)}, planned_rounds=5)
    assert main(["run", "--federation", str(FEDERATION), "--home", str(tmp_path), "--resume"]) == 0
    assert "resuming digits-demo after round 3 of 5: 2 rounds left" in capsys.readouterr().out
    assert submitted and submitted[0]["resume"] is True


@pytest.mark.parametrize("break_it, named", [
    (lambda fed, sites: fed.write_text(fed.read_text().replace("sites/factory-b.yaml", "sites/factory-x.yaml")),
     ["factory-x.yaml: file not found", "sites:"]),
    (lambda fed, sites: fed.write_text(fed.read_text().replace("round_timeout:", "round_timout:")),
     ["federation.yaml: round_timout: unknown key (did you mean round_timeout?)"]),
    (lambda fed, sites: fed.write_text(fed.read_text().replace("builtin:digits-cnn", "model.onnx")),
     ["federation.yaml: model:", "model.onnx not found"]),
    (lambda fed, sites: (sites / "fleet-c.yaml").write_text((sites / "fleet-c.yaml").read_text().replace(
        "target:", "targt:")), ["fleet-c.yaml: targt: unknown key (did you mean target?)"]),
], ids=["missing-site-file", "misspelt-federation-key", "missing-model", "misspelt-site-key"])
def test_run_refuses_a_bad_file_in_one_line_before_asking_the_superlink(tmp_path, monkeypatch, capsys, break_it,
                                                                        named):
    import shutil

    from cuvil_edge.coordinator import preflight, superlink

    shutil.copytree(FEDERATION.parent, tmp_path / "configs")
    fed = tmp_path / "configs" / "federation.yaml"
    break_it(fed, tmp_path / "configs" / "sites")
    monkeypatch.setattr(preflight, "wait_for_sites", lambda *a, **k: pytest.fail("asked the SuperLink"))
    monkeypatch.setattr(superlink, "submit_run", lambda *a, **k: pytest.fail("submitted"))
    assert main(["run", "--federation", str(fed), "--home", str(tmp_path / "home")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(part in err for part in named), err
