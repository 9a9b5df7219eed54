"""The Flower ClientApp's evaluate handler: a replayed or duplicated message never releases twice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, Metadata, RecordDict

from cuvil_edge.agent import client_app
from cuvil_edge.config import load_federation, load_site
from cuvil_edge.config.home import site_state_dir
from cuvil_edge.config.run_spec import RUN_CONFIG_KEY
from cuvil_edge.coordinator.keys import load_signing_keys
from cuvil_edge.coordinator.launcher import prepare_run
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir_serialize import write_package
from cuvil_edge.privacy import PrivacyLedger

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path):
    """Partition 0 of the demo federation, its package, and a way to deliver evaluate messages."""
    spec = prepare_run(ROOT / "configs" / "federation.yaml", tmp_path / "run", home=tmp_path / "home")
    site = load_site(load_federation(spec.federation).sites[0])
    keys = load_signing_keys(Path(spec.coordinator_key))
    now = int(time.time())
    package = write_package(load_model(digits_cnn_onnx(0)), site=site.site, target=site.target, version=4,
                            signing_key=keys.coordinator, release_key=keys.release, issued_at=now,
                            expires=now + 600, roots=keys.roots)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                      run_config={RUN_CONFIG_KEY: str(Path(spec.run_dir) / "run_spec.json")})

    def deliver(server_round: int, kind: str = "evaluate", **extra) -> Message:
        config = ConfigRecord({"site": site.site, "package": package, "server-round": server_round, **extra})
        meta = Metadata(run_id=1, message_id=f"m{time.monotonic_ns()}", src_node_id=0, dst_node_id=1,
                        reply_to_message_id="", group_id="", created_at=time.time(), ttl=600,
                        message_type=MessageType.EVALUATE if kind == "evaluate" else MessageType.TRAIN)
        content = {"config": config} if kind == "evaluate" else {"config": config, "arrays": ArrayRecord()}
        msg = Message(content=RecordDict(content), metadata=meta)
        return (client_app.evaluate if kind == "evaluate" else client_app.train)(msg, context)

    ledger = PrivacyLedger(site_state_dir(site, Path(spec.home)) / "ledger.sqlite", site=site.site,
                           epsilon_budget=site.privacy.epsilon_budget, delta=site.privacy.delta)
    return deliver, ledger


def test_three_sequential_evaluate_deliveries_release_once(node):
    deliver, ledger = node
    replies = [deliver(1) for _ in range(3)]
    assert not replies[0].has_error() and "noisy-correct" in replies[0].content["metrics"]
    assert all(r.has_error() and (r.error.code, r.error.reason) == (4007, "replayed") for r in replies[1:])
    assert len(ledger.history()) == 1 and ledger.history()[0]["status"] == "committed"


def test_two_concurrent_evaluate_deliveries_release_once(node):
    deliver, ledger = node
    barrier, replies = threading.Barrier(2), []

    def run():
        barrier.wait()
        try:
            replies.append(deliver(2))
        except BaseException as e:  # surfaced below: a handler must never raise
            replies.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, Message) for r in replies), replies
    assert sorted(r.has_error() for r in replies) == [False, True]
    assert len(ledger.history()) == 1


def test_a_train_reply_carries_exactly_the_weights_the_coordinator_named(node):
    deliver, ledger = node
    graph = load_model(digits_cnn_onnx(0))
    named = sorted(k for k, v in graph.initializers.items() if v.dtype == np.float32)[:2]
    reply = deliver(1, "train", **{"reply-keys": named})
    assert not reply.has_error(), reply.error.reason
    assert list(reply.content["arrays"].keys()) == named


def test_a_request_for_weights_the_package_lacks_is_refused_before_any_budget_is_spent(node):
    deliver, ledger = node
    reply = deliver(1, "train", **{"reply-keys": ["not-a-weight"]})
    assert reply.has_error() and (reply.error.code, reply.error.reason) == (4001, "package-rejected")
    assert ledger.spent() == 0 and ledger.history() == []
