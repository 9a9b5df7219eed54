"""The round recorder alone, without a federation: each site's typed round gives exactly the
metrics.json entry report.py, status.py and the end-to-end tests read; replies are sorted into
kept, failed (a code, never its reason), out of budget and silent; and a completed round is
checkpointed before its report row is written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.app import Error, Message, MessageType, Metadata, MetricRecord, RecordDict

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.coordinator.checkpoints import latest_checkpoint
from cuvil_edge.coordinator.personaliser import EVAL, TRAIN, Issued, Personalised
from cuvil_edge.coordinator.report import EXHAUSTED_STATUS, FAILED_STATUS, NOT_PUSHED_STATUS, RunReport
from cuvil_edge.coordinator.round_recorder import Checkpointing, RoundRecorder, SiteRound
from flower_identity import flower_identity  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("flower_identity")


def _reply(metrics: dict | None = None, code: int | None = None, kind=MessageType.TRAIN) -> Message:
    meta = Metadata(run_id=1, message_id="r", src_node_id=1, dst_node_id=0, reply_to_message_id="m", group_id="",
                    created_at=0.0, ttl=60, message_type=kind)
    if code is not None:
        return Message(Error(code=code, reason="DataError: /srv/clinic/patient-0042.csv line 9"), metadata=meta)
    return Message(RecordDict({rp.METRICS_RECORD: MetricRecord(metrics)}), metadata=meta)


TRAINED = {rp.NUM_EXAMPLES: 40, "train-seconds": 0.5, rp.EPS_SPENT: 1.0, rp.EPS_REMAINING: 7.0}
EVALUATED = {rp.NOISY_CORRECT: 30, rp.NOISY_TOTAL: 40, rp.COUNT_NOISE_SCALE: 2.0, rp.EPS_SPENT: 1.5,
             rp.EPS_REMAINING: 6.5, rp.BUDGET_EXHAUSTED: 0}


def test_a_site_round_is_exactly_the_metrics_json_entry():
    recorder = RoundRecorder()
    recorder.record_sent(Personalised(1, TRAIN, issued={"a": Issued(1234, "fp16")}, seconds=0.25))
    recorder.record_replies(1, TRAIN, [("a", _reply(TRAINED))], asked={"a"})
    recorder.record_sent(Personalised(1, EVAL, issued={"a": Issued(1234, "fp16")}, seconds=0.5))
    kept = recorder.record_replies(1, EVAL, [("a", _reply(EVALUATED, kind=MessageType.EVALUATE))], asked={"a"})
    recorder.pool_evaluation(1, kept)
    assert recorder.sites(1) == {"a": {
        "status": "ok", "package-bytes": 1234, "precision": "fp16",
        "train-num-examples": 40, "train-train-seconds": 0.5,
        "eval-noisy-correct": 30, "eval-noisy-total": 40, "eval-count-noise-scale": 2.0, "eval-budget-exhausted": 0,
        "eps-spent": 1.5, "eps-remaining": 6.5,  # the ledger's totals as the latest reply gave them
        "eval-accuracy": 0.75}}
    assert recorder.timings[1] == {"train-packages-seconds": 0.25, "eval-packages-seconds": 0.5}
    assert set(recorder.evaluations[1]) >= {"accuracy", "low", "high", "noisy_total"}
    assert SiteRound().to_dict() == {}  # a site nothing happened to has no entry of its own


def test_a_failure_keeps_its_code_only_and_later_success_does_not_hide_it(caplog):
    recorder = RoundRecorder()
    failed = _reply(code=rp.Failures.DATA_INVALID.code)
    kept = recorder.record_replies(3, TRAIN, [("a", failed)], asked={"a"})
    assert kept == [("a", failed)] and failed.error.reason == "data-invalid"  # Flower counts it, logs only the code
    recorder.record_replies(3, EVAL, [("a", _reply(EVALUATED, kind=MessageType.EVALUATE))], asked={"a"})
    entry = recorder.sites(3)["a"]
    assert entry["status"] == FAILED_STATUS and entry["train-error"] == "data-invalid"
    assert "patient-0042" not in caplog.text and "patient-0042" not in json.dumps(entry)


def test_an_exhausted_site_is_dropped_unless_central_dp_keeps_its_zero_update():
    exhausted = {rp.NUM_EXAMPLES: 0, rp.BUDGET_EXHAUSTED: 1, rp.EPS_SPENT: 8.0, rp.EPS_REMAINING: 0.0}
    for keep, want in ((False, []), (True, ["b"])):
        recorder = RoundRecorder()
        kept = recorder.record_replies(1, TRAIN, [("b", _reply(exhausted))], asked={"b"}, keep_exhausted=keep)
        assert [site for site, _ in kept] == want
        assert recorder.site(1, "b").status == EXHAUSTED_STATUS and recorder.sites(1)["b"]["eps-remaining"] == 0.0
    recorder = RoundRecorder()  # an evaluation is never kept, even under central DP
    assert recorder.record_replies(1, EVAL, [("b", _reply(exhausted))], asked={"b"}, keep_exhausted=True) == []


def test_a_silent_site_and_a_refused_one_are_named():
    recorder = RoundRecorder()
    recorder.record_sent(Personalised(2, TRAIN, issued={"a": Issued(10, "fp32"), "b": Issued(10, "fp32")},
                                      refused={"c": "memory 9 MiB > limits.memory_mb 1"}))
    recorder.record_replies(2, TRAIN, [("a", _reply(TRAINED))], asked={"a", "b"})
    sites = recorder.sites(2)
    assert sites["b"] == {"status": FAILED_STATUS, "package-bytes": 10, "precision": "fp32",
                          "train-error": "no reply within the round timeout"}
    assert sites["c"] == {"status": NOT_PUSHED_STATUS, "train-error": "not pushed: memory 9 MiB > limits.memory_mb 1"}
    recorder.record_sent(Personalised(None, TRAIN))  # nobody sampled: nothing to record
    assert set(recorder.timings) == {2}


def test_an_unusable_evaluation_count_is_nan_and_nothing_pooled_is_none():
    recorder = RoundRecorder()
    zero = _reply({**EVALUATED, rp.NOISY_CORRECT: 3, rp.NOISY_TOTAL: -2}, kind=MessageType.EVALUATE)
    assert recorder.pool_evaluation(1, [("a", zero), ("b", _reply(code=5))]) is None  # noisy total <= 0
    assert 1 not in recorder.evaluations
    assert math.isnan(recorder.site(1, "a").eval_accuracy) and recorder.site(1, "b").eval_accuracy is None
    assert RoundRecorder().pool_evaluation(1, []) is None


def test_central_accounting_is_recorded_as_metrics_json_shows_it():
    from types import SimpleNamespace

    recorder = RoundRecorder()
    spent = SimpleNamespace(epsilon=np.float64(1.5), delta=1e-5, num_releases=np.int64(2))
    assert recorder.record_central(4, True, 1.0, 0.5, spent) == {
        "released": True, "noise_multiplier": 1.0, "clipping_norm": 0.5, "epsilon": 1.5, "delta": 1e-5, "releases": 2}
    assert recorder.record_central(5, False, 1.0, 0.5) == {"released": False, "noise_multiplier": 1.0,
                                                            "clipping_norm": 0.5}
    assert type(recorder.central[4]["epsilon"]) is float and recorder.central[5]["released"] is False


class _Report(RunReport):
    """A report that checks the round's checkpoint is on disk before its row is written."""

    def __init__(self, run_dir, sites, home):
        super().__init__(run_dir, sites)
        self.home, self.checkpointed = home, []

    def add_round(self, server_round, *args, **kwargs):
        found = latest_checkpoint(self.home, "fed")
        self.checkpointed.append(None if found is None else found.round)
        return super().add_round(server_round, *args, **kwargs)


def test_a_completed_round_is_checkpointed_before_its_row_and_numbered_on_from_the_offset(tmp_path):
    site = SiteConfig.model_validate({"site": "a", "target": "x86-64", "privacy": {
        "epsilon_budget": 8.0, "epsilon_per_round": 2.0}})
    (tmp_path / "run").mkdir()
    report = _Report(tmp_path / "run", [site], tmp_path / "home")
    weights = {"w": np.ones((2, 2), np.float32)}
    recorder = RoundRecorder(report, Checkpointing(tmp_path / "home", "fed", planned_rounds=5))
    recorder.round_offset = 2  # a resumed run: this run's round 1 is the federation's round 3
    recorder.record_replies(1, TRAIN, [("a", _reply(TRAINED))], asked={"a"})
    initial = recorder.round_done(0, 0.5, weights)
    assert initial["round"] == 2 and initial["initial"] and latest_checkpoint(tmp_path / "home", "fed") is None
    entry = recorder.round_done(1, 0.75, {"w": weights["w"] + 1})
    assert report.checkpointed == [None, 3]  # round 0 is never checkpointed again; round 3 was before its row
    checkpoint = latest_checkpoint(tmp_path / "home", "fed")
    assert checkpoint.round == 3 and np.array_equal(checkpoint.weights["w"], weights["w"] + 1)
    assert entry["sites"]["a"] == {"target": "x86-64", **recorder.sites(1)["a"]}
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in written] == [2, 3] and written[1]["sites"]["a"]["status"] == "ok"
    assert RoundRecorder().round_done(1, 0.5, weights) is None  # no report, no checkpoint: nothing written
