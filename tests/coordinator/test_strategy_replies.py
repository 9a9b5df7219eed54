"""Replies are credited to the site that was asked (by message id), and missing or failed sites are named."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, Metadata, MetricRecord, RecordDict

from cuvil_edge.config import load_federation
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
from cuvil_edge.coordinator.report import FAILED_STATUS, format_round
from cuvil_edge.coordinator.strategy import SitePackageFedAvg
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from flower_identity import flower_identity  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


def _reply(sent: Message, src: int, *, error: str | None = None, arrays: ArrayRecord | None = None) -> Message:
    meta = Metadata(run_id=1, message_id=f"reply-{time.monotonic_ns()}", src_node_id=src, dst_node_id=0,
                    reply_to_message_id=sent.metadata.message_id, group_id="1", created_at=time.time(), ttl=60,
                    message_type=MessageType.TRAIN)
    if error is not None:
        return Message(Error(code=5, reason=error), metadata=meta)  # Flower's NODE_UNAVAILABLE
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})}), metadata=meta)


pytestmark = pytest.mark.usefixtures("flower_identity")


def test_a_dead_nodes_failure_is_credited_to_its_site_and_silence_is_reported(tmp_path):
    sites = load_federation(ROOT / "configs" / "federation.yaml").load_sites()
    init_keys(tmp_path / "keys")
    graph = load_model(digits_cnn_onnx(0))
    factory = PackageFactory(graph, sites, load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                             VersionCounter(tmp_path / "versions.json"), 600)
    strategy = SitePackageFedAvg(factory, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    for node, site in zip((11, 12, 13), sites):
        strategy.directory.bind(node, site.site)
    arrays = ArrayRecord({k: Array(np.array(v)) for k, v in graph.initializers.items() if v.dtype == np.float32})
    asks = [Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=n,
                    message_type=MessageType.TRAIN) for n in (11, 12, 13)]
    sent = strategy.personalise(asks, arrays, grid=None)
    for i, m in enumerate(sent):  # what the grid does when it pushes them
        m.metadata.__dict__["_message_id"] = f"msg-{i}"
    # the SuperLink answers for the dead first node; its reply names another source node
    replies = [_reply(sent[0], src=12, error="Node Unavailable: no heartbeat"), _reply(sent[1], src=12, arrays=arrays)]

    strategy.aggregate_train(1, replies)

    stats = strategy.recorder.sites(1)
    assert stats[sites[0].site]["status"] == FAILED_STATUS and stats[sites[0].site]["train-error"] == "flower-node-unavailable"
    assert stats[sites[1].site]["status"] == "ok"
    assert stats[sites[2].site]["status"] == FAILED_STATUS
    assert "no reply" in stats[sites[2].site]["train-error"]
    shown = {site: {"target": "x", **entry} for site, entry in stats.items()}
    table = format_round({"round": 1, "global_accuracy": 0.5, "sites": shown, "dropped_out": []})
    assert f"{sites[0].site} failed (train): flower-node-unavailable" in table


class _Grid:
    """The grid's answers to the two questions the strategy asks (a transport stand-in)."""

    def __init__(self, names: dict[int, str], answers: dict[int, str]):
        self.names, self.answers = names, answers

    def get_nodes(self):
        from types import SimpleNamespace

        return [SimpleNamespace(node_id=nid, name=name) for nid, name in self.names.items()]

    def send_and_receive(self, messages, timeout):
        replies = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = f"q{m.metadata.dst_node_id}"
            meta = Metadata(run_id=1, message_id=f"a{m.metadata.dst_node_id}", src_node_id=m.metadata.dst_node_id,
                            dst_node_id=0, reply_to_message_id=m.metadata.message_id, group_id="", created_at=time.time(),
                            ttl=60, message_type=MessageType.QUERY)
            replies.append(Message(RecordDict({"config": ConfigRecord({"site": self.answers[m.metadata.dst_node_id]})}),
                                   metadata=meta))
        return replies


def _strategy(tmp_path):
    sites = load_federation(ROOT / "configs" / "federation.yaml").load_sites()
    init_keys(tmp_path / "keys")
    factory = PackageFactory(load_model(digits_cnn_onnx(0)), sites, load_signing_keys(tmp_path / "keys" /
                             "coordinator.key"), VersionCounter(tmp_path / "versions.json"), 600)
    return SitePackageFedAvg(factory), [s.site for s in sites]


def test_a_node_is_the_name_it_authenticated_with_not_what_it_answers(tmp_path):
    strategy, sites = _strategy(tmp_path)
    grid = _Grid({1: sites[0], 2: sites[1]}, answers={1: sites[1], 2: sites[1]})  # both *claim* sites[1]
    strategy.directory.resolve(grid, [1, 2])
    assert strategy.directory.bindings() == {1: sites[0], 2: sites[1]}


def test_two_nodes_claiming_one_site_get_one_binding(tmp_path):
    strategy, sites = _strategy(tmp_path)
    grid = _Grid({}, answers={1: sites[0], 2: sites[0]})  # simulation: no registered names, a QUERY each
    strategy.directory.resolve(grid, [1, 2])
    assert list(strategy.directory.bindings().values()) == [sites[0]]
