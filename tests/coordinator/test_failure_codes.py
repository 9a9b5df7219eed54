"""The coordinator keeps only a failure reply's code: whatever reason text a site
(an old agent, or Flower relaying a site's exception) puts in its reply, the round table, the log
and metrics.json hold the code's name from config/round_protocol.py, never the text."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, Metadata, RecordDict

from cuvil_edge.config import load_federation
from cuvil_edge.config.round_protocol import Failures
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
from cuvil_edge.coordinator.report import FAILED_STATUS, RunReport
from cuvil_edge.coordinator.strategy import SitePackageFedAvg
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from flower_identity import flower_identity  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("flower_identity")

#: The texts the audit found in replies: dataset size, a record's position and label, a raw cell,
#: a patient's file name, a rare class, a local path.
LEAKS = {
    Failures.MODEL_INCOMPATIBLE: "DataError: records have shape (5,) (57 records, 57 labels)",
    Failures.DATA_INVALID: "DataError: /srv/clinic/d.csv line 9: column 'chol' holds 'HIV+', not a number",
    Failures.PACKAGE_REJECTED: "DataError: 'patient-0042-smith-john.dcm' is not PNG/JPEG",
    Failures.INTERNAL_ERROR: "DataError: label 2 of record 35 is out of range; class 'rare-syndrome' has no image",
}
SECRETS = ("57 records", "record 35", "HIV+", "chol", "smith-john", "rare-syndrome", "/srv/clinic", "DataError")


def _reply(sent: Message, src: int, code: int, reason: str, kind=MessageType.TRAIN) -> Message:
    meta = Metadata(run_id=1, message_id=f"reply-{time.monotonic_ns()}", src_node_id=src, dst_node_id=0,
                    reply_to_message_id=sent.metadata.message_id, group_id="1", created_at=time.time(), ttl=60,
                    message_type=kind)
    return Message(Error(code=code, reason=reason), metadata=meta)


@pytest.mark.parametrize("kind", [MessageType.TRAIN, MessageType.EVALUATE])
def test_reason_text_in_a_failure_reply_never_reaches_the_report_or_metrics(tmp_path, caplog, kind):
    sites = load_federation(ROOT / "configs" / "federation.yaml").load_sites()
    init_keys(tmp_path / "keys")
    graph = load_model(digits_cnn_onnx(0))
    factory = PackageFactory(graph, sites, load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                             VersionCounter(tmp_path / "versions.json"), 600)
    strategy = SitePackageFedAvg(factory, fraction_train=1.0, min_train_nodes=1, min_available_nodes=1,
                                 fraction_evaluate=1.0, min_evaluate_nodes=1)
    for i, s in enumerate(sites):
        strategy.directory.bind(11 + i, s.site)
    arrays = ArrayRecord({k: Array(np.array(v)) for k, v in graph.initializers.items() if v.dtype == np.float32})
    asks = [Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=11 + i, message_type=kind)
            for i in range(len(sites))]
    sent = strategy.personalise(asks, arrays, grid=None)
    for i, m in enumerate(sent):
        m.metadata.__dict__["_message_id"] = f"msg-{i}"
    failures = list(LEAKS.items())[:len(sent)]
    replies = [_reply(m, 11 + i, failure.code, text, kind) for i, (m, (failure, text)) in enumerate(zip(sent, failures))]

    with caplog.at_level(logging.DEBUG):
        if kind == MessageType.TRAIN:
            strategy.aggregate_train(1, replies)
        else:
            strategy.aggregate_evaluate(1, replies)
        report = RunReport(tmp_path, sites)
        entry = report.add_round(1, 0.5, strategy.recorder.sites(1))

    phase = "train" if kind == MessageType.TRAIN else "eval"
    for site, (failure, _) in zip(sites, failures):
        assert entry["sites"][site.site]["status"] == FAILED_STATUS
        assert entry["sites"][site.site][f"{phase}-error"] == failure.name
    written = (tmp_path / "metrics.json").read_text()
    assert json.loads(written)["rounds"][0]["sites"][sites[0].site][f"{phase}-error"] == failures[0][0].name
    for secret in SECRETS:
        assert secret not in written and secret not in caplog.text, secret


def test_a_code_outside_the_set_is_named_by_its_number_only():
    from cuvil_edge.config.round_protocol import failure_text

    assert failure_text(4999) == "error-4999"
    assert failure_text(5) == "flower-node-unavailable"  # Flower's own codes by Flower's name
    assert failure_text(Failures.DATA_INVALID.code) == "data-invalid"
