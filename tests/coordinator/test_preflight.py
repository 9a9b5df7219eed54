"""Before `cuvil-edge run` submits: every listed site enrolled, and online or waited for up to the
federation's start_timeout (coordinator/preflight.py), decided without a federation."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuvil_edge.coordinator.preflight import Decision, SitesNotReadyError, decide, wait_for_sites

LISTED = {"hospital-a": Path("sites/hospital-a.yaml"), "factory-b": Path("sites/factory-b.yaml"),
          "fleet-c": Path("sites/fleet-c.yaml")}
ALL = set(LISTED)


@pytest.mark.parametrize("online, min_sites, waited, expected", [
    (ALL, None, 0, Decision(start=True)),
    ({"hospital-a", "fleet-c"}, None, 0, Decision(start=False, missing=("factory-b",))),
    ({"hospital-a", "fleet-c"}, 2, 299.9, Decision(start=False, missing=("factory-b",))),  # waits even so
    ({"hospital-a", "fleet-c"}, 2, 300, Decision(start=True, missing=("factory-b",))),
    (set(), None, 0, Decision(start=False, missing=("hospital-a", "factory-b", "fleet-c"))),
], ids=["all-online", "one-offline-waits", "min-sites-met-still-waits", "deadline-min-sites-met-goes-on",
        "none-online-waits"])
def test_decide(online, min_sites, waited, expected):
    assert decide(LISTED, ALL, online, min_sites=min_sites, waited=waited, start_timeout=300) == expected


@pytest.mark.parametrize("online, min_sites", [({"hospital-a", "fleet-c"}, None), ({"hospital-a"}, 2)],
                         ids=["all-needed", "fewer-than-min-sites"])
def test_past_the_deadline_too_few_online_is_refused_naming_the_offline(online, min_sites):
    with pytest.raises(SitesNotReadyError) as refused:
        decide(LISTED, ALL, online, min_sites=min_sites, waited=301, start_timeout=300)
    message = str(refused.value)
    offline = sorted(ALL - online)
    assert all(site in message for site in offline) and "start_timeout" in message and "min_sites" in message
    assert all(site not in message for site in online) and "\n" not in message


def test_a_listed_site_that_is_not_enrolled_is_refused_at_once_with_its_file_and_the_fix():
    with pytest.raises(SitesNotReadyError) as refused:  # online or not, it could never join
        decide(LISTED, {"hospital-a", "fleet-c"}, ALL, min_sites=1, waited=0, start_timeout=300)
    message = str(refused.value)
    assert "factory-b (sites/factory-b.yaml)" in message and "not enrolled" in message
    assert "cuvil-edge coordinator enroll" in message and "sites:" in message and "hospital-a" not in message


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def _wait(tmp_path, online_by_time, min_sites=None, start_timeout=10):
    """wait_for_sites with a fake clock; ``online_by_time``: (from this many seconds, online set)."""
    clock, said = Clock(), []
    began = clock.now

    def online():
        return [up for since, up in online_by_time if clock.now - began >= since][-1]

    missing = wait_for_sites(tmp_path, LISTED, min_sites=min_sites, start_timeout=start_timeout, echo=said.append,
                             online=online, clock=clock, sleep=clock.sleep)
    return missing, said, clock.now - began


def _enrolled(tmp_path, sites=ALL):
    import json

    (tmp_path / "sites.json").write_text(json.dumps({"format": 1, "sites": {s: {"node_id": "1"} for s in sites}}))


def test_a_site_that_comes_online_in_time_is_waited_for_and_named_once(tmp_path):
    _enrolled(tmp_path)
    missing, said, waited = _wait(tmp_path, [(0, {"hospital-a"}), (5, ALL)], start_timeout=300)
    assert missing == () and 5 <= waited < 8
    assert said == ["waiting up to 300 s for factory-b, fleet-c (enrolled, offline)"]


def test_past_the_deadline_the_run_goes_on_with_min_sites_naming_who_is_missing(tmp_path):
    _enrolled(tmp_path)
    missing, said, waited = _wait(tmp_path, [(0, {"hospital-a", "fleet-c"})], min_sites=2, start_timeout=10)
    assert missing == ("factory-b",) and waited == pytest.approx(10)
    assert said[0] == "waiting up to 10 s for factory-b (enrolled, offline)"
    assert said[1].startswith("starting without factory-b (offline after 10 s; 2 of 3 sites are online")


def test_past_the_deadline_without_min_sites_the_run_is_refused(tmp_path):
    _enrolled(tmp_path)
    with pytest.raises(SitesNotReadyError, match="factory-b is enrolled but offline after 10 s"):
        _wait(tmp_path, [(0, {"hospital-a", "fleet-c"})], start_timeout=10)


def test_all_online_starts_without_a_word(tmp_path):
    _enrolled(tmp_path)
    assert _wait(tmp_path, [(0, ALL)]) == ((), [], 0)
