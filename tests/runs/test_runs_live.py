"""A worker's live runs: started once, attached to, forgotten when stopped (real processes)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from apportion.protocol.base import Message
from apportion.protocol.codec import decode_message
from apportion.protocol.services import TaskNote
from apportion.runs.launcher import ProcessLauncher
from apportion.runs.live import LiveRuns
from apportion.runs.messages import RunEnded, RunStarted
from apportion.runs.spec import new_spec
from apportion.worker.context import CancelEvent
from apportion.worker.long_lived import WorkerLink

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]


class Outbox:
    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        assert isinstance(message, TaskNote), message  # all about the run's task
        with self.lock:
            self.sent.append(decode_message(message.note))

    def of(self, kind: type[Message]) -> list[Message]:
        with self.lock:
            return [msg for msg in self.sent if isinstance(msg, kind)]


def live_runs(outbox: Outbox) -> LiveRuns:
    """Real processes, stopped with a one-second grace, reporting to ``outbox``."""
    runs = LiveRuns(ProcessLauncher())
    runs.attach(WorkerLink(outbox, kill_grace=1.0))
    return runs


def test_attaching_to_a_run_that_ended_reports_its_end_not_a_new_start() -> None:
    outbox = Outbox()
    runs = live_runs(outbox)
    spec = new_spec([sys.executable, "-c", "print('hi')"])
    first = runs.execute(7, spec, dict(os.environ), "", threading.Event())
    assert first.reason == "completed" and runs.keys() == ["run-7"]  # not settled: adoptable
    again = runs.execute(7, spec, dict(os.environ), "", threading.Event())  # adopted
    assert again is first
    assert len(outbox.of(RunStarted)) == 1 and len(outbox.of(RunEnded)) == 1
    runs.settled(7)
    assert runs.keys() == []


def test_a_stopped_copy_is_forgotten_so_a_later_attempt_starts_afresh() -> None:
    outbox = Outbox()
    runs = live_runs(outbox)
    spec = new_spec([sys.executable, "-c", "print('run')"])
    runs.execute(3, spec, dict(os.environ), "", threading.Event())
    runs.cancel([3])  # the scheduler did not adopt this copy
    assert runs.keys() == []
    runs.execute(3, spec, dict(os.environ), "", threading.Event())
    assert len(outbox.of(RunStarted)) == 2  # the command ran again


def test_an_interrupted_run_ends_preempted_and_stays_adoptable_until_settled() -> None:
    # The interruption (preemption) is kept with the run, not with the task that
    # asked for it: a scheduler restarted meanwhile adopts the run and hears the same.
    outbox = Outbox()
    runs = live_runs(outbox)
    spec = new_spec(["sleep", "30"])
    stop = CancelEvent()
    ran: list[object] = []
    thread = threading.Thread(
        target=lambda: ran.append(runs.execute(5, spec, dict(os.environ), "", stop)),
        daemon=True,
    )
    thread.start()
    try:
        for _ in range(100):
            if outbox.of(RunStarted):
                break
            threading.Event().wait(0.05)
        assert outbox.of(RunStarted)
    finally:
        stop.interrupted = True
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    [outcome] = ran
    assert outcome.reason == "preempted"  # type: ignore[attr-defined]
    assert outcome.detail == "preempted; stopped with SIGTERM"  # type: ignore[attr-defined]
    assert runs.keys() == ["run-5"]  # its end is not reported to a live session yet
    adopted = runs.execute(5, spec, dict(os.environ), "", threading.Event())
    assert adopted is outcome
    [end] = outbox.of(RunEnded)
    assert (end.reason, end.signal) == ("preempted", 15)  # type: ignore[attr-defined]
    runs.settled(5)
    assert runs.keys() == []
