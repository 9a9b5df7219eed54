"""What `cuvil-edge run` shows of `flwr run --stream`: the report and Flower's warnings and errors,
each on one line; Flower's info lines and tracebacks only with --verbose. And how a run that did
not complete is told: the ServerApp's own error, on one line."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from cuvil_edge.coordinator import superlink
from cuvil_edge.coordinator.flwr_stream import MARK, MarkedFormatter, StreamFilter, failure_reason

#: A stream as `flwr run --stream` relays it (Flower colours its level names).
STREAM = [
    "Using SuperLink: cuvil (127.0.0.1:9092)\n",
    "Successfully started run 123\n",
    "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
    "\x1b[92mINFO \x1b[0m:      Starting FedAvgM strategy:\n",
    "\x1b[92mINFO \x1b[0m:      \t├── Number of rounds: 2\n",
    f"{MARK}round 0: global test accuracy 0.1333\n",
    "\x1b[92mINFO \x1b[0m:      [ROUND 1/2]\n",
    "\x1b[93mWARNING \x1b[0m:   Received 2 results and 1 failures\n",
    f"{MARK}round 1: global test accuracy 0.3889\n",
    f"{MARK}  site          target\n",
    f"{MARK}  ! factory-b failed (train): the package was refused\n",
    "\x1b[91mERROR \x1b[0m:     ServerApp raised an exception\n",
    "Traceback (most recent call last):\n",
    '  File "server_app.py", line 1, in main\n',
    "cuvil_edge.coordinator.server_app.NoSiteTrainedError: no site trained in any round\n",
    "\x1b[91mERROR \x1b[0m:     Failed to push task output: connection refused\n",
    "a line of Ray's\n",
]


def test_without_verbose_only_the_report_and_flowers_warnings_and_errors_show():
    shown = [out for out in map(StreamFilter(), STREAM) if out is not None]
    assert shown == [
        "Successfully started run 123\n",
        "round 0: global test accuracy 0.1333\n",
        "\x1b[93mWARNING \x1b[0m:   Received 2 results and 1 failures\n",
        "round 1: global test accuracy 0.3889\n",
        "  site          target\n",
        "  ! factory-b failed (train): the package was refused\n",
        "\x1b[91mERROR \x1b[0m:     Failed to push task output: connection refused\n",
    ]


def test_verbose_shows_every_line_without_the_marks():
    assert [StreamFilter(verbose=True)(line) for line in STREAM] == [line.replace(MARK, "") for line in STREAM]


def test_the_report_marks_each_line_of_a_record_and_errors_but_not_warnings():
    report = logging.makeLogRecord({"msg": "round 1\n  site", "levelno": logging.INFO})
    assert MarkedFormatter().format(report) == f"{MARK}round 1\n{MARK}  site"
    errors = MarkedFormatter(marked_level=logging.ERROR, marked_prefix="error: ")
    assert errors.format(logging.makeLogRecord({"msg": "bad", "levelno": logging.ERROR})) == f"{MARK}error: bad"
    assert errors.format(logging.makeLogRecord({"msg": "meh", "levelno": logging.WARNING})) == "meh"


@pytest.mark.parametrize("details, reason", [
    ("ServerApp failed with exception: no site trained in any round: a: refused",
     "no site trained in any round: a: refused"),
    ("Task failed with\nunknown error.", "Task failed with unknown error."),
    (None, ""),
])
def test_the_failure_reason_is_the_serverapps_own_error_on_one_line(details, reason):
    assert failure_reason({"status-details": details}) == reason


def _runs_before_and_after(monkeypatch, after: list[dict], returncode: int = 0, hidden=()):
    listed = iter([[], after])
    monkeypatch.setattr(superlink, "_runs", lambda home, connection: next(listed))
    monkeypatch.setattr("cuvil_edge.coordinator.flwr_stream.relay",
                        lambda command, env, timeout, verbose: (subprocess.CompletedProcess(command, returncode),
                                                                list(hidden)))


def test_a_failed_run_raises_with_the_serverapps_reason(monkeypatch, tmp_path):
    _runs_before_and_after(monkeypatch, [{"run-id": "7", "status": "finished:failed",
                                          "status-details": "ServerApp failed with exception: nothing to resume"}])
    with pytest.raises(superlink.RunEndedError) as ended:
        superlink.flwr_run(tmp_path, Path("app"), "cuvil", "")
    assert ended.value.reason == "nothing to resume" and ended.value.status == "finished:failed"
    assert str(ended.value) == "the run ended as 'finished:failed': nothing to resume"


def test_a_flwr_run_that_failed_before_any_run_says_what_it_said_last(monkeypatch, tmp_path):
    _runs_before_and_after(monkeypatch, [], returncode=1, hidden=["Using SuperLink: cuvil\n", "Invalid app\n"])
    with pytest.raises(superlink.RunEndedError, match="'no run': flwr run exit 1: Using SuperLink: cuvil Invalid app"):
        superlink.flwr_run(tmp_path, Path("app"), "cuvil", "")


def test_a_completed_run_returns_its_status(monkeypatch, tmp_path):
    _runs_before_and_after(monkeypatch, [{"run-id": "7", "status": "finished:completed"}])
    assert superlink.flwr_run(tmp_path, Path("app"), "cuvil", "") == "finished:completed"
