"""A ClientApp task superseded by a newer one (its SuperNode reconnected and took a new message
without waiting for its reply) stops and sends no reply, but only once it has taken its message: a
task that ended before taking it would be handed out again and supersede the newer task in turn."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cuvil_edge.agent import app_gate
from cuvil_edge.agent.app_gate import SUPERSEDED_SIGNAL
from task_executor import alive, waiting_task



@pytest.fixture
def supersession():
    before = signal.getsignal(SUPERSEDED_SIGNAL)
    s = app_gate._Supersession()
    s.install()
    yield s
    signal.signal(SUPERSEDED_SIGNAL, before)


def _signal_self() -> None:
    os.kill(os.getpid(), SUPERSEDED_SIGNAL)
    time.sleep(0.05)  # the handler runs in the main thread at the next bytecode


def test_superseded_before_taking_its_message_it_takes_it_then_stops(supersession):
    _signal_self()  # while it starts or pulls its input: nothing is interrupted

    with pytest.raises(app_gate._Superseded):
        supersession.taken()


def test_superseded_while_it_runs_it_stops_at_once(supersession):
    supersession.taken()

    with pytest.raises(app_gate._Superseded):
        _signal_self()


def test_once_its_outputs_are_being_pushed_the_signal_interrupts_nothing(supersession):
    supersession.taken()
    supersession.done()

    _signal_self()

    assert supersession.came


def test_superseded_is_not_an_exception_the_clientapp_could_turn_into_a_reply():
    assert not issubclass(app_gate._Superseded, Exception)


def test_a_task_process_superseded_before_it_took_its_message_keeps_trying_to_take_it():
    """A real task process, started as the executor starts one, against a Runtime API nobody
    serves (so it is still taking its input)."""
    with waiting_task() as (_, task):
        os.kill(task, SUPERSEDED_SIGNAL)
        time.sleep(2)
        assert alive(task), "the signal ended a task that had not taken its message"
