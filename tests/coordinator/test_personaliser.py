"""The personaliser alone, with a stand-in package factory: each known site gets a message of its
own around its package, a refused site and an unknown node get nothing, replies are credited by the
message they answer, rounded replies land on the exact weights and the aggregate keeps the dtypes sent."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, Metadata, MetricRecord, RecordDict

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.coordinator.personaliser import EVAL, TRAIN, Personaliser
from cuvil_edge.coordinator.site_directory import SiteDirectory
from flower_identity import flower_identity  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("flower_identity")
WEIGHTS = {"w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "b": np.array([0.5, -0.25], np.float32)}


@dataclass
class _Package:
    data: bytes


class _Factory:
    """What the personaliser asks of a PackageFactory: a package per site, and the weights a
    rounded package really carries (here: a public shift of 0.125 for the fp16 site)."""

    def __init__(self):
        self.sites = {"a": None, "b": None, "c": None}
        self.refused = {"c": "its plan does not fit"}
        self.precisions = {"b": "fp16"}
        self.issued: list[str] = []

    def issue(self, site, weights):
        self.issued.append(site)
        return _Package(f"package for {site}".encode())

    def shipped(self, site, weights):
        shift = 0.125 if self.precisions.get(site) == "fp16" else 0.0
        return {k: np.asarray(v + shift, np.float32) for k, v in weights.items()}


def _parts():
    factory = _Factory()
    directory = SiteDirectory(factory.sites)
    for node, site in ((1, "a"), (2, "b"), (3, "c")):
        directory.bind(node, site)
    return factory, directory, Personaliser(factory, directory)


def _asks(nodes=(1, 2, 3, 4), kind=MessageType.TRAIN, **config):
    shared = RecordDict({rp.CONFIG_RECORD: ConfigRecord({rp.SERVER_ROUND: 2, **config})})  # as FedAvg shares it
    return [Message(shared, dst_node_id=n, message_type=kind) for n in nodes]


def _arrays():
    return ArrayRecord({k: Array(v) for k, v in WEIGHTS.items()})


def _reply(sent: Message, src: int, arrays: dict | None = None, error: bool = False) -> Message:
    meta = Metadata(run_id=1, message_id=f"r-{sent.metadata.message_id}", src_node_id=src, dst_node_id=0,
                    reply_to_message_id=sent.metadata.message_id, group_id="", created_at=0.0, ttl=60,
                    message_type=MessageType.TRAIN)
    if error:
        return Message(Error(code=5, reason="x"), metadata=meta)
    record = ArrayRecord({k: Array(np.asarray(v)) for k, v in (arrays or {}).items()})
    return Message(RecordDict({rp.ARRAYS_RECORD: record, rp.METRICS_RECORD: MetricRecord({rp.NUM_EXAMPLES: 1})}),
                   metadata=meta)


def _pushed(personaliser, **config):
    sent = personaliser.personalise(_asks(**config), _arrays())
    for i, m in enumerate(sent.messages):  # what the grid does when it pushes them
        m.metadata.__dict__["_message_id"] = f"m{i}"
    return sent


def test_each_known_planned_site_gets_its_own_message_and_package():
    factory, _, personaliser = _parts()
    sent = personaliser.personalise(_asks(), _arrays())
    assert (sent.server_round, sent.phase) == (2, TRAIN)
    assert [m.metadata.dst_node_id for m in sent.messages] == [1, 2]  # node 4 is nobody, site c is refused
    assert factory.issued == ["a", "b"] and sent.refused == {"c": "its plan does not fit"}
    assert {s: (i.package_bytes, i.precision) for s, i in sent.issued.items()} == {
        "a": (len(b"package for a"), "fp32"), "b": (len(b"package for b"), "fp16")}
    configs = [m.content[rp.CONFIG_RECORD] for m in sent.messages]
    assert [c[rp.SITE] for c in configs] == ["a", "b"] and configs[0] is not configs[1]
    assert [c[rp.PACKAGE] for c in configs] == [b"package for a", b"package for b"]
    assert all(c[rp.SERVER_ROUND] == 2 for c in configs) and sent.seconds >= 0
    assert personaliser.sent_sites() == {"a", "b"}


def test_evaluate_messages_are_the_eval_phase_and_no_messages_no_round():
    _, _, personaliser = _parts()
    assert personaliser.personalise(_asks(kind=MessageType.EVALUATE), _arrays()).phase == EVAL
    empty = personaliser.personalise([], _arrays())
    assert empty.server_round is None and empty.messages == [] and personaliser.sent_sites() == set()


def test_a_plain_round_sends_the_package_alone_and_central_dp_the_shipped_weights():
    factory, _, personaliser = _parts()
    for m in personaliser.personalise(_asks(), _arrays()).messages:
        assert len(m.content[rp.ARRAYS_RECORD]) == 0
        assert list(m.content[rp.CONFIG_RECORD][rp.REPLY_KEYS]) == list(WEIGHTS)
    for m in personaliser.personalise(_asks(**{rp.CLIPPING_NORM: 1.0}), _arrays()).messages:
        site = m.content[rp.CONFIG_RECORD][rp.SITE]
        got = {k: a.numpy() for k, a in m.content[rp.ARRAYS_RECORD].items()}
        assert all(np.array_equal(got[k], factory.shipped(site, WEIGHTS)[k]) for k in WEIGHTS)
        assert rp.REPLY_KEYS not in m.content[rp.CONFIG_RECORD]


def test_a_reply_is_credited_to_the_message_it_answers_not_its_source_node():
    _, _, personaliser = _parts()
    first, second = _pushed(personaliser).messages
    assert personaliser.site_of(_reply(first, src=2, error=True)) == "a"  # the SuperLink answers for a dead node
    stray = _reply(first, src=2)
    stray.metadata.__dict__["_reply_to_message_id"] = "unknown"
    assert personaliser.site_of(stray) == "b"  # no such message: its source node's site
    stray.metadata.__dict__["_src_node_id"] = 99
    assert personaliser.site_of(stray) == "node-99"


def test_a_rounded_sites_update_lands_on_the_exact_weights_and_fp32_is_unchanged():
    factory, _, personaliser = _parts()
    to_a, to_b = _pushed(personaliser).messages
    delta = {k: np.full_like(v, 0.01) for k, v in WEIGHTS.items()}
    replies = [_reply(m, n, {k: factory.shipped(s, WEIGHTS)[k] + delta[k] for k in WEIGHTS})
               for m, n, s in ((to_a, 1, "a"), (to_b, 2, "b"))] + [_reply(to_a, 1, error=True)]
    a, b, failed = personaliser.reanchor(replies)
    for reply in (a, b):
        for k, v in WEIGHTS.items():
            np.testing.assert_allclose(reply.content[rp.ARRAYS_RECORD][k].numpy(), v + delta[k], atol=1e-6)
    assert failed.has_error()


def test_the_aggregate_comes_back_in_the_dtypes_sent():
    _, _, personaliser = _parts()
    assert personaliser.as_sent(None) is None
    personaliser.personalise(_asks(), _arrays())
    wide = ArrayRecord({k: Array(v.astype(np.float64)) for k, v in WEIGHTS.items()})
    assert {k: a.numpy().dtype for k, a in personaliser.as_sent(wide).items()} == {k: np.float32 for k in WEIGHTS}
