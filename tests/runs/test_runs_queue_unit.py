"""The job queue as a client of the scheduler's state machine, without sockets.

The queue's journal and log I/O happens on its writer thread: each test runs on an
event loop of its own and waits for the writer (``settle``) before reading the journal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion.protocol.base import Message
from apportion.protocol.codec import encode_message
from apportion.protocol.services import TaskNote
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.protocol.worker import (
    FreeKeys,
    InterruptTasks,
    RegisterWorker,
    TaskFinished,
    TaskRaised,
)
from apportion.runs.journal import COMPLETED, QUEUED, RUNNING, Journal
from apportion.runs.messages import RunEnded, RunOutput, RunsSubmitted, RunStarted, SubmitRuns
from apportion.runs.queue import QueueOptions, RunQueue, waiting_text
from apportion.runs.spec import new_spec
from apportion.scheduler.dispatch import handle
from apportion.scheduler.events import (
    ClientJoined,
    Event,
    FromClient,
    FromWorker,
    PlacementDue,
    ServiceEffect,
    Tick,
    WorkerJoined,
)
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import PROCESSING
from apportion.scheduler.state import SchedulerConfig, SchedulerState
from apportion.scheduler.wire import to_wire

pytestmark = pytest.mark.timeout(10)


RUNS_CLIENT = "runs"


class FakeHost:
    """The service's part: events into the state machine, what it sends recorded; the
    queue's link to it (``send``), as the queue's client."""

    def __init__(self) -> None:
        self.state = SchedulerState()
        self.sent: list[tuple[str, Message]] = []
        self.queue: RunQueue | None = None
        self.journals: list[Journal] = []

    def handle(self, event: Event) -> None:
        for command in handle(self.state, event):
            if not isinstance(command, ServiceEffect):
                peer_id, message = to_wire(command)
                if peer_id == RUNS_CLIENT and self.queue is not None:
                    self.queue.on_message(message)
                else:
                    self.sent.append((peer_id, message))

    def send(self, messages: list[Message]) -> None:
        self.handle(FromClient(RUNS_CLIENT, messages, 0.0))

    def note(self, worker_id: str, run_id: int, message: Message) -> None:
        """The worker ``worker_id`` says something about a run."""
        note = TaskNote(f"run-{run_id}", encode_message(message), 0)
        self.handle(FromWorker(worker_id, [note], 0.0))


@pytest.fixture
def host() -> Iterator[FakeHost]:
    fake = FakeHost()
    yield fake
    check_invariants(fake.state)
    if fake.queue is not None:
        fake.queue.writer.close()
    for journal in fake.journals:
        journal.close()


def make_queue(host: FakeHost, tmp_path: Path, **options: object) -> tuple[RunQueue, Journal]:
    journal = Journal(tmp_path / "runs.db")
    host.journals.append(journal)
    host.handle(ClientJoined(RUNS_CLIENT, 0.0))
    host.queue = None  # not before it exists
    queue = RunQueue(journal, host, QueueOptions(**options))  # type: ignore[arg-type]
    host.queue = queue
    return queue, journal


def run(body: Coroutine[Any, Any, None]) -> None:
    asyncio.run(body)


async def settle(queue: RunQueue) -> None:
    """Wait until the writer has done everything handed over, and its answers are in."""
    await asyncio.wrap_future(queue.writer.sync())
    await asyncio.sleep(0.01)  # answers come back to the loop through call_soon_threadsafe
    await asyncio.wrap_future(queue.writer.sync())


def register(host: FakeHost, worker_id: str, live_runs: list[int] | None = None) -> RegisterWorker:
    live = [f"run-{run_id}" for run_id in live_runs or []]
    reg = RegisterWorker(worker_id, f"sim://{worker_id}", 2, {}, 1, 0, {}, 0, live)
    host.handle(WorkerJoined(worker_id, reg, 0.0))
    return reg


def test_output_sent_again_after_a_reconnection_is_written_once(
    host: FakeHost, tmp_path: Path
) -> None:
    async def body() -> None:
        queue, journal = make_queue(host, tmp_path)
        (run_id,) = journal.stage([new_spec(["true"])], 0.0, queued=True)
        await queue.start(0.0, 0.0)
        register(host, "w1")
        host.note("w1", run_id, RunStarted(run_id, 42, ""))
        host.note("w1", run_id, RunOutput(run_id, 0, b"hello "))
        host.note("w1", run_id, RunOutput(run_id, 0, b"hello world\n"))  # resent
        host.note("w1", run_id, RunOutput(run_id, 20, b"later\n"))  # 8 bytes lost
        await settle(queue)
        text = journal.log_path(run_id).read_text()
        assert text == "hello world\n\n[apportion: 8 bytes of output were lost here]\nlater\n"

    run(body())


def test_a_run_running_at_a_restart_is_adopted_by_its_returning_worker(
    host: FakeHost, tmp_path: Path
) -> None:
    async def body() -> None:
        journal = Journal(tmp_path / "runs.db")
        (run_id,) = journal.stage([new_spec(["sleep", "9"], resources="gpu=1")], 0.0, queued=True)
        journal.mark_running(run_id, "w1", "gpu=[1]", 0.0)
        journal.close()
        queue, journal = make_queue(host, tmp_path, adopt_grace=30.0)
        await queue.start(0.0, 0.0)
        assert queue.life.awaiting == {run_id: 30.0}
        units = {"gpu": ["0", "1"]}
        live = [f"run-{run_id}"]
        reg = RegisterWorker("w1", "sim://w1", 2, {"gpu": 20_000}, 1, 0, units, 0, live)
        host.handle(WorkerJoined("w1", reg, 1.0))  # the scheduler tells the queue
        await settle(queue)
        task = host.state.tasks[f"run-{run_id}"]
        assert task.state == PROCESSING and task.allocation is not None
        assert task.allocation.units == {"gpu": ["1"]}  # the same GPU
        assert not queue.life.awaiting and journal.get(run_id).state == RUNNING  # type: ignore[union-attr]
        host.note("w1", run_id, RunEnded(run_id, 0, 0, "completed", "exit code 0"))
        host.handle(FromWorker("w1", [TaskFinished(f"run-{run_id}", 8, 1.0, "dict")], 2.0))
        await settle(queue)
        assert journal.get(run_id).state == COMPLETED  # type: ignore[union-attr]

    run(body())


def test_a_run_preempted_across_a_scheduler_restart_is_requeued_without_a_retry(
    host: FakeHost, tmp_path: Path
) -> None:
    # The scheduler that asked for the stop died; this one resumes the journal (the
    # run running, attempt 1, no retry) and knows nothing of the stop. The worker
    # comes back with the run, which then ends preempted: queued again, not failed.
    async def body() -> None:
        journal = Journal(tmp_path / "runs.db")
        spec = new_spec(["sleep", "60"], resources="GPU=1", preemptible=True)
        (run_id,) = journal.stage([spec], 0.0, queued=True)
        journal.mark_running(run_id, "w1", "GPU=1", 0.0)
        journal.close()
        host.state = SchedulerState(SchedulerConfig(preempt_after=1.0))
        queue, journal = make_queue(host, tmp_path, adopt_grace=30.0)
        await queue.start(0.0, 0.0)
        key = f"run-{run_id}"
        live = [key]
        reg = RegisterWorker("w1", "sim://w1", 2, {"GPU": 10_000}, 1, 0, {}, 0, live)
        host.handle(WorkerJoined("w1", reg, 1.0))
        await settle(queue)
        assert host.state.tasks[key].state == PROCESSING  # adopted
        ended = RunEnded(run_id, -1, 15, "preempted", "preempted; stopped with SIGTERM")
        host.note("w1", run_id, ended)
        host.note("w1", run_id, ended)  # said again: heard once
        raised = TaskRaised(key, b"e", b"tb", 1.0, interrupted=1)
        host.handle(FromWorker("w1", [raised], 2.0))
        host.handle(PlacementDue(2.0))
        await settle(queue)
        record = journal.get(run_id)
        assert record is not None
        assert (record.state, record.attempts, record.preemptions) == (QUEUED, 1, 1)
        assert queue.failures == 0
        history = [text for _, text in journal.history(run_id)]
        assert any(
            t.startswith("preempted (the stop was asked before the scheduler restarted)")
            for t in history
        ), history
        task = host.state.tasks[key]
        assert task.retries == 0  # the scheduler ran it again without using a retry
        assert task.state == PROCESSING  # started again at once: nothing else wants the GPU
        host.note("w1", run_id, RunStarted(run_id, 43, "GPU=1"))
        await settle(queue)
        record = journal.get(run_id)
        assert record is not None and (record.state, record.attempts) == (RUNNING, 2)

    run(body())


def test_a_run_whose_worker_never_returns_is_queued_again(host: FakeHost, tmp_path: Path) -> None:
    async def body() -> None:
        journal = Journal(tmp_path / "runs.db")
        (run_id,) = journal.stage([new_spec(["true"], retries=1)], 0.0, queued=True)
        journal.mark_running(run_id, "gone", "", 0.0)
        journal.close()
        queue, journal = make_queue(host, tmp_path, adopt_grace=5.0)
        await queue.start(0.0, 0.0)
        queue.tick(6.0, 6.0)
        await settle(queue)
        record = journal.get(run_id)
        assert record is not None and record.state == QUEUED
        assert any("did not come back" in text for _, text in journal.history(run_id))
        assert f"run-{run_id}" in host.state.tasks

    run(body())


def test_a_returning_worker_is_told_to_stop_runs_nobody_waits_for(
    host: FakeHost, tmp_path: Path
) -> None:
    async def body() -> None:
        queue, _ = make_queue(host, tmp_path)
        await queue.start(0.0, 0.0)
        register(host, "w1", live_runs=[99])
        await settle(queue)
        assert ("w1", FreeKeys(["run-99"])) in host.sent

    run(body())


def test_waiting_text_is_one_line_without_the_state() -> None:
    text = "queued: needs gpu=1\n  w1: all 1 threads busy\n  w2: gpu 0 of 1 free"
    assert waiting_text(text) == "needs gpu=1; w1: all 1 threads busy; w2: gpu 0 of 1 free"


def _submit(queue: RunQueue, *specs: dict[str, Any]) -> list[RunsSubmitted]:
    answers: list[RunsSubmitted] = []

    def reply(message: Message) -> None:
        assert isinstance(message, RunsSubmitted)
        answers.append(message)

    queue.request(SubmitRuns(7, list(specs)), reply)
    return answers


def test_a_submission_carries_each_runs_verdict(host: FakeHost, tmp_path: Path) -> None:
    async def body() -> None:
        queue, journal = make_queue(host, tmp_path)
        await queue.start(0.0, 0.0)
        alone = _submit(queue, new_spec(["true"], resources="GPU=1").to_dict())
        await settle(queue)
        (answer,) = alone
        assert answer.verdicts == [["no workers", "no worker is connected yet: it waits for one"]]
        reg = RegisterWorker("w1", "sim://w1", 2, {"GPU": 20_000}, 1, 0, {}, 0, [])
        host.handle(WorkerJoined("w1", reg, 0.0))
        answers = _submit(
            queue,
            new_spec(["fits"], resources="GPU=1").to_dict(),
            new_spec(["too-big"], resources="GPU=3").to_dict(),
        )
        await settle(queue)
        (answer,) = answers
        _, too_big = answer.ids
        assert answer.verdicts[0] == ["", ""]
        kind, text = answer.verdicts[1]
        assert kind == "unsatisfiable" and "largest GPU supply is 2 on w1" in text
        # Queued all the same: a worker that can run it may join.
        assert journal.get(too_big).state == QUEUED  # type: ignore[union-attr]
        assert f"run-{too_big}" in host.state.tasks

    run(body())


def test_a_misspelt_resource_is_refused_and_nothing_queued(host: FakeHost, tmp_path: Path) -> None:
    async def body() -> None:
        queue, journal = make_queue(host, tmp_path)
        await queue.start(0.0, 0.0)
        reg = RegisterWorker("w1", "sim://w1", 2, {"GPU": 20_000}, 1, 0, {}, 0, [])
        host.handle(WorkerJoined("w1", reg, 0.0))
        answers = _submit(
            queue,
            new_spec(["fine"]).to_dict(),
            new_spec(["typo"], resources="gpu=1").to_dict(),
        )
        await settle(queue)
        (answer,) = answers
        assert answer.ids == [] and answer.error == (
            "the run asks for gpu=1, but no connected worker offers gpu: did you mean GPU "
            "(not gpu)? (the workers offer GPU=2 on w1); nothing was queued"
        )
        assert journal.runs() == []

    run(body())


def test_a_preemptible_run_is_stopped_for_another_share_and_journalled_as_preempted(
    host: FakeHost, tmp_path: Path
) -> None:
    async def body() -> None:
        host.state = SchedulerState(SchedulerConfig(preempt_after=1.0))
        queue, journal = make_queue(host, tmp_path)
        spec = new_spec(["sleep", "60"], resources="GPU=1", preemptible=True)
        (run_id,) = journal.stage([spec], 0.0, queued=True)
        await queue.start(0.0, 0.0)
        key = f"run-{run_id}"
        reg = RegisterWorker("w1", "sim://w1", 2, {"GPU": 10_000}, 1, 0, {}, 0, [])
        host.handle(WorkerJoined("w1", reg, 0.0))
        host.handle(PlacementDue(0.0))
        assert host.state.tasks[key].state == PROCESSING
        host.note("w1", run_id, RunStarted(run_id, 42, "GPU=1"))
        host.handle(ClientJoined("b", 0.0))
        b_task = TaskSpec("b-0", "f", b"", [], {"GPU": 10_000}, 0, 0)
        host.handle(FromClient("b", [SubmitTasks([b_task], {"f": b"fn"}, ["b-0"])], 0.5))
        host.handle(Tick(0.5))
        host.handle(Tick(1.6))
        assert ("w1", InterruptTasks([key])) in host.sent
        await settle(queue)
        assert queue.life.preempting == {run_id: host.state.preemption.stopping[key].reason}
        # The worker stops the command, says so, and the task raises.
        host.note("w1", run_id, RunEnded(run_id, 143, 0, "preempted", "preempted; exit 143"))
        raised = TaskRaised(key, b"e", b"tb", 1.0, interrupted=1)
        host.handle(FromWorker("w1", [raised], 1.7))
        host.handle(PlacementDue(1.7))
        await settle(queue)
        record = journal.get(run_id)
        assert record is not None
        assert (record.state, record.attempts, record.preemptions) == (QUEUED, 1, 1)
        assert record.reason.startswith("preempted for share 'b'")
        assert host.state.tasks["b-0"].state == PROCESSING
        assert host.state.tasks[key].state == QUEUED and host.state.tasks[key].retries == 0
        host.handle(FromWorker("w1", [TaskFinished("b-0", 8, 1.0, "int")], 2.0))
        host.handle(PlacementDue(2.0))
        host.note("w1", run_id, RunStarted(run_id, 43, "GPU=1"))
        await settle(queue)
        record = journal.get(run_id)
        assert record is not None and (record.state, record.attempts) == (RUNNING, 2)

    run(body())
