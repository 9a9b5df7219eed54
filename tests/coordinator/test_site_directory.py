"""The site directory alone, without a federation: a node is its registered name on the deployment
engine and what it answers only in simulation, two live nodes are never one site, a restarted node
takes its site over, and nodes already known never cost the grid a message."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, Metadata, RecordDict

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.coordinator.site_directory import SiteDirectory, registered_names
from flower_identity import flower_identity  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("flower_identity")
ENROLLED = ("hospital-a", "factory-b", "fleet-c")


class _Grid:
    """Registered names (deployment engine; empty in simulation) and each node's QUERY answer
    (a site name, or an int: a Flower error code)."""

    def __init__(self, names: dict[int, str] | None = None, answers: dict[int, str | int] | None = None):
        self.names, self.answers, self.queried = names or {}, answers or {}, []

    def get_nodes(self):
        return [SimpleNamespace(node_id=nid, name=name) for nid, name in self.names.items()]

    def send_and_receive(self, messages, timeout):
        replies = []
        for m in messages:
            node = m.metadata.dst_node_id
            self.queried.append(node)
            assert m.metadata.message_type == MessageType.QUERY
            assert m.content[rp.CONFIG_RECORD][rp.ASK] == rp.SITE
            meta = Metadata(run_id=1, message_id=f"a{node}", src_node_id=node, dst_node_id=0,
                            reply_to_message_id=f"q{node}", group_id="", created_at=time.time(), ttl=60,
                            message_type=MessageType.QUERY)
            answer = self.answers[node]
            if isinstance(answer, int):
                replies.append(Message(Error(code=answer, reason="secret text"), metadata=meta))
            else:
                replies.append(Message(RecordDict({rp.CONFIG_RECORD: ConfigRecord({rp.SITE: answer})}), metadata=meta))
        return replies


def test_a_registered_node_is_its_name_whatever_it_would_answer():
    directory = SiteDirectory(ENROLLED)
    grid = _Grid(names={1: "hospital-a", 2: "factory-b"}, answers={1: "factory-b", 2: "factory-b"})
    directory.resolve(grid, [1, 2])
    assert directory.bindings() == {1: "hospital-a", 2: "factory-b"}
    assert grid.queried == []  # names settle it: nobody is asked


def test_a_registered_name_that_is_no_enrolled_site_gets_nothing(caplog):
    directory = SiteDirectory(ENROLLED)
    directory.resolve(_Grid(names={1: "hospital-a", 2: "intruder"}), [1, 2])
    assert directory.site_of(1) == "hospital-a" and directory.site_of(2) is None
    assert "not an enrolled site" in caplog.text


def test_in_simulation_a_node_is_asked_once_and_bad_answers_bind_nothing(caplog):
    directory = SiteDirectory(ENROLLED)
    grid = _Grid(answers={1: "hospital-a", 2: "nowhere", 3: 5})  # an unknown site, a Flower error
    directory.resolve(grid, [1, 2, 3])
    assert directory.bindings() == {1: "hospital-a"}
    assert "claims unknown site 'nowhere'" in caplog.text and "secret text" not in caplog.text
    directory.resolve(grid, [1])  # known: no second QUERY
    assert grid.queried == [1, 2, 3]


def test_known_nodes_never_touch_the_grid():
    directory = SiteDirectory(ENROLLED)
    assert directory.bind(7, "fleet-c")
    directory.resolve(None, [7])  # would fail on any grid call
    assert directory.site_of(7) == "fleet-c" and directory.bindings() == {7: "fleet-c"}


def test_two_live_nodes_claiming_one_site_get_one_binding(caplog):
    directory = SiteDirectory(ENROLLED)
    directory.resolve(_Grid(answers={1: "hospital-a", 2: "hospital-a"}), [1, 2])
    assert list(directory.bindings().values()) == ["hospital-a"]
    assert "two nodes cannot be one site" in caplog.text
    assert not directory.bind(3, "hospital-a", active=[1, 3])


def test_a_restarted_node_takes_its_site_over_from_its_old_id():
    directory = SiteDirectory(ENROLLED)
    directory.resolve(_Grid(answers={1: "hospital-a", 2: "factory-b"}), [1, 2])
    directory.resolve(_Grid(answers={9: "hospital-a"}), [9, 2])  # node 1 came back as node 9
    assert directory.bindings() == {2: "factory-b", 9: "hospital-a"}
    assert directory.site_of(1) is None


def test_a_grid_without_names_is_simulation():
    assert registered_names(SimpleNamespace()) == {}
    assert registered_names(_Grid(names={4: "x"})) == {4: "x"}
    assert registered_names(_Grid(names={4: ""})) == {}
