"""How a run ends and is told: a run in which no site trained fails with each site's reason; a
resumed run's first entry (the checkpoint's model) shows no site table, never a column of "no
reply"; `cuvil-edge run` exits 1 with one line when its run fails, 2 when a check before it fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuvil_edge.config import load_federation
from cuvil_edge.coordinator import server_app
from cuvil_edge.coordinator.launcher import prepare_run
from cuvil_edge.coordinator.report import RunReport, format_round

ROOT = Path(__file__).resolve().parents[2]
FED = ROOT / "configs" / "federation.yaml"
SITES = load_federation(FED).load_sites()


def _failed(reason: str) -> dict:
    return {s.site: {"status": "failed", "train-error": reason} for s in SITES}


def test_a_run_in_which_no_site_trained_fails_naming_each_site_and_why(tmp_path, monkeypatch):
    spec = prepare_run(FED, tmp_path / "run", rounds=2, home=tmp_path / "home")

    def every_round_fails(strategy, report, grid, arrays, *, num_rounds, timeout, evaluate_fn):
        report.add_round(0, 0.1, {}, initial=True)
        for r in range(1, num_rounds + 1):
            report.add_round(r, 0.1, _failed("PACKAGE_REJECTED") if r < num_rounds else
                             {**_failed("no reply within the round timeout"),
                              "fleet-c": {"status": "budget exhausted"}})

    monkeypatch.setattr(server_app, "start_rounds", every_round_fails)
    with pytest.raises(server_app.NoSiteTrainedError) as failed:
        server_app.run_federation(None, spec)
    assert str(failed.value) == ("no site trained in any round: hospital-a: no reply within the round timeout, "
                                 "factory-b: no reply within the round timeout, fleet-c: budget exhausted")
    assert len(json.loads((tmp_path / "run" / "metrics.json").read_text())["rounds"]) == 3  # the report stays


def test_one_site_training_once_is_a_run_that_trained(tmp_path):
    report = RunReport(tmp_path, SITES)
    report.add_round(0, 0.1, {}, initial=True)
    assert report.no_site_trained() is None  # no round yet: nothing to say
    report.add_round(1, 0.1, _failed("PACKAGE_REJECTED"))
    report.add_round(2, 0.2, {**_failed("PACKAGE_REJECTED"), "factory-b": {"status": "ok"}})
    assert report.no_site_trained() is None


def test_a_resumed_runs_first_entry_is_the_checkpoint_not_a_round_of_no_replies(tmp_path):
    report = RunReport(tmp_path, SITES)
    entry = report.add_round(3, 0.8, {}, initial=True)  # resumed after round 3: nobody was asked yet
    shown = format_round(entry)
    assert shown == "round 3: global test accuracy 0.8000 (the checkpoint this run resumes from)"
    assert "no reply" not in format_round(report.add_round(4, 0.81, {s.site: {"status": "ok"} for s in SITES}))


def test_a_simulated_run_whose_serverapp_failed_after_every_round_is_told_by_its_reason(tmp_path):
    from cuvil_edge.coordinator.launcher import RunFailedError, completed_metrics
    from cuvil_edge.coordinator.superlink import RunEndedError

    report = RunReport(tmp_path, SITES)
    for r in range(3):
        report.add_round(r, 0.1, _failed("PACKAGE_REJECTED") if r else {}, initial=r == 0)
    reason = report.no_site_trained()
    with pytest.raises(RunFailedError) as failed:
        completed_metrics(tmp_path, 2, RunEndedError(f"the run ended as 'finished:failed': {reason}",
                                                     "finished:failed", reason))
    assert str(failed.value).startswith("no site trained in any round: hospital-a: PACKAGE_REJECTED, factory-b")


def test_demo_whose_run_failed_exits_1_with_one_line(tmp_path, monkeypatch, capsys):
    from cuvil_edge.cli.main import main
    from cuvil_edge.coordinator import launcher

    def failed(spec, app_dir, verbose=False):
        raise launcher.RunFailedError("no site trained in any round: hospital-a: PACKAGE_REJECTED")

    monkeypatch.setattr(launcher, "run_in_simulation", failed)
    code = main(["demo", "--federation", str(FED), "--rounds", "1", "--run-dir", str(tmp_path / "run"),
                 "--home", str(tmp_path / "home")])
    assert code == 1
    assert capsys.readouterr().err == "error: no site trained in any round: hospital-a: PACKAGE_REJECTED\n"
