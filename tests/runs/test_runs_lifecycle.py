"""The job queue's lifecycle, pure: events in, commands out, no journal, no scheduler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apportion.core.transitions import IllegalTransition
from apportion.runs import run_events as e
from apportion.runs.lifecycle import (
    NOT_BACK,
    PREEMPTED_BEFORE_RESTART,
    RunLifecycle,
    check_invariants,
    final_state,
    never_fits,
)
from apportion.runs.run_states import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FINISHED,
    LOST,
    QUEUED,
    RUNNING,
    STAGED,
    check_run_move,
)
from apportion.runs.views import RunView

pytestmark = pytest.mark.timeout(60)


def view(run_id: int, state: str = QUEUED, **fields: object) -> RunView:
    return RunView(run_id, str(run_id), state, **fields)  # type: ignore[arg-type]


@pytest.fixture
def life() -> Iterator[RunLifecycle]:
    machine = RunLifecycle(adopt_grace=30.0)
    yield machine
    check_invariants(machine)


def of(kind: type[object], commands: list[e.Command]) -> list[object]:
    return [c for c in commands if isinstance(c, kind)]


def ended(run_id: int, reason: str = "completed", detail: str = "exit code 0") -> e.Ended:
    return e.Ended(run_id, 0 if reason == "completed" else 1, 0, reason, detail, 1.0, 1.0)


def test_an_illegal_move_raises() -> None:
    check_run_move(1, QUEUED, RUNNING)
    with pytest.raises(IllegalTransition, match=r"^job queue: run 1 is completed; it cannot"):
        check_run_move(1, COMPLETED, RUNNING)
    with pytest.raises(ValueError):
        check_run_move(1, RUNNING, QUEUED, only_from=STAGED)


def test_a_submitted_run_is_scheduled_with_its_retries(life: RunLifecycle) -> None:
    out = life.handle(e.Submitted((view(1, retries=2),), 0.0, 0.0))
    assert of(e.Schedule, out) == [e.Schedule(1, 2)]
    assert life.active == {1}


def test_a_run_that_starts_and_completes(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    out = life.handle(e.Started(1, "w1", "gpu=[0]", 42, 1.0, 1.0))
    assert of(e.NewAttempt, out) == [e.NewAttempt(1, 0)]
    assert of(e.MarkRunning, out) == [e.MarkRunning(1, "w1", "gpu=[0]", 1.0)]
    life.handle(ended(1))
    out = life.handle(e.TaskDone(1, None, 2.0, 2.0))
    assert out[0] == e.Release(1)
    assert of(e.MarkEnded, out) == [e.MarkEnded(1, COMPLETED, 0, None, "", 2.0)]
    assert life.idle() and life.failures == 0


def test_a_task_end_maps_to_a_run_state() -> None:
    assert final_state(None, None) == (COMPLETED, "")
    assert final_state(("cancelled", ""), None) == (CANCELLED, "cancelled before it started")
    assert final_state(("lost", "worker w1 lost"), None) == (LOST, "worker w1 lost")
    assert final_state(("crashed", "SIGKILL"), None) == (LOST, "SIGKILL")
    timed = ended(1, "timed out", "after 1s")
    assert final_state(("failed", "RunFailed"), timed) == (FAILED, "timed out: after 1s")
    assert final_state(("failed", "RunFailed"), ended(1, "failed", "exit 3")) == (FAILED, "exit 3")


def test_a_retry_requeues_then_runs_again(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1, retries=1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(ended(1, "failed", "exit 1"))
    out = life.handle(e.Started(1, "w2", "", 43, 2.0, 2.0))
    assert of(e.Requeue, out) == [e.Requeue(1, "attempt 1 ended: exit 1; retrying", 2.0)]
    assert of(e.NewAttempt, out) == [e.NewAttempt(1, 1)]
    assert life.runs[1].attempts == 2 and life.runs[1].worker == "w2"


def test_a_started_run_is_cancelled_once_its_processes_are_gone(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    out = life.handle(e.Polled((), (1,), 1.5, 1.5))
    assert out == [e.CancelTask(1)]
    assert life.handle(e.Polled((), (1,), 1.6, 1.6)) == []  # asked once
    out = life.handle(e.TaskDone(1, ("cancelled", ""), 2.0, 2.0))
    assert out == [] and life.stopping == {1: ("w1", ("cancelled", ""))}  # task kept
    out = life.handle(ended(1, "cancelled", "SIGTERM after cancel"))
    assert out[0] == e.Release(1)
    assert of(e.MarkEnded, out) == [e.MarkEnded(1, CANCELLED, 1, None, "SIGTERM after cancel", 1.0)]
    assert life.idle() and life.failures == 1


def test_a_cancel_after_completion_completes(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(ended(1))
    out = life.handle(e.TaskDone(1, ("cancelled", ""), 2.0, 2.0))
    assert of(e.MarkEnded, out)[0].state == COMPLETED  # type: ignore[attr-defined]


def test_a_stopping_run_settles_when_its_worker_leaves(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(e.Polled((), (1,), 1.5, 1.5))
    life.handle(e.TaskDone(1, ("cancelled", "asked"), 2.0, 2.0))
    out = life.handle(e.WorkerGone("w1", 3.0, 3.0))
    [mark] = of(e.MarkEnded, out)
    assert mark == e.MarkEnded(1, CANCELLED, None, None, "cancelled before it started", 3.0)


def test_a_worker_leaving_requeues_its_running_runs(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1), view(2)), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "gpu=[1]", 42, 1.0, 1.0))
    life.handle(e.Started(2, "w2", "", 43, 1.0, 1.0))
    out = life.handle(e.WorkerGone("w1", 2.0, 2.0))
    assert of(e.Requeue, out) == [e.Requeue(1, "its worker w1 left", 2.0)]
    assert life.runs[1].state == QUEUED and life.runs[2].state == RUNNING
    # It comes back with the command still running: adopted, holding the same GPU.
    out = life.handle(e.WorkerBack("w1b", "w1", (1,), {1: "queued"}, 3.0, 3.0))
    assert of(e.Adopt, out) == [e.Adopt("w1b", 1, 0, "gpu=[1]")]
    assert of(e.MarkRunning, out) == [e.MarkRunning(1, "w1", "gpu=[1]", 3.0)]


def test_staged_runs_are_queued_unless_a_fixed_cluster_never_fits_them() -> None:
    life = RunLifecycle(0.0, fixed_supply={"gpu": 10_000})
    fits = view(1, STAGED, resources="gpu=1", demand={"gpu": 10_000})
    too_big = view(2, STAGED, resources="gpu=2", demand={"gpu": 20_000})
    unknown = view(3, STAGED, resources="foo=1", demand={"foo": 10_000})
    out = life.handle(e.Polled((fits, too_big, unknown), (), 0.0, 0.0))
    assert of(e.MarkQueued, out) == [e.MarkQueued((1,), 0.0)]
    assert of(e.Schedule, out) == [e.Schedule(1, 0)]
    waiting = {c.run_id: c.text for c in of(e.SetWaiting, out)}  # type: ignore[attr-defined]
    assert "requires more than the cluster has: gpu=2" in waiting[2]
    assert "not defined for the cluster: foo" in waiting[3]
    assert life.ignored.keys() == {2, 3}
    assert life.ignored[3] == (
        "run 3: the --run-once cluster (gpu=1) cannot run it: "
        "requires resources not defined for the cluster: foo"
    )
    assert of(e.SetWaiting, life.handle(e.Polled((too_big,), (), 1.0, 1.0))) == []  # once
    check_invariants(life)


def test_never_fits_without_a_fixed_cluster_is_empty() -> None:
    assert never_fits({"gpu": 1}, None) == ""


def test_never_fits_suggests_the_name_a_misspelt_one_was_meant_to_be() -> None:
    assert never_fits({"gpu": 10_000}, {"GPU": 10_000}) == (
        "requires resources not defined for the cluster: gpu (did you mean GPU (not gpu)?)"
    )


def test_a_run_running_at_a_restart_is_adopted(life: RunLifecycle) -> None:
    running = view(1, RUNNING, attempts=1, worker="w1", held="gpu=[1]")
    life.handle(e.Resumed((), (running,), 0.0, 0.0))
    assert life.awaiting == {1: 30.0}
    out = life.handle(e.WorkerBack("peer-1", "w1", (1, 9), {}, 1.0, 1.0))
    assert of(e.Adopt, out) == [e.Adopt("peer-1", 1, 0, "gpu=[1]")]  # no retries left
    assert of(e.StopStrays, out) == [e.StopStrays("peer-1", (9,))]
    assert of(e.MarkRunning, out) == []  # the journal already says running
    assert of(e.Note, out) == [e.Note(1, "adopted: still running on w1", 1.0)]


def test_a_run_whose_worker_never_returns(life: RunLifecycle) -> None:
    retried = view(1, RUNNING, attempts=1, retries=1, worker="w1")
    spent = view(2, RUNNING, attempts=1, worker="w1")
    cancelled = view(3, RUNNING, attempts=1, worker="w1", cancel_requested=True)
    life.handle(e.Resumed((), (retried, spent, cancelled), 0.0, 0.0))
    assert life.handle(e.Tick(29.0, 29.0)) == []
    out = life.handle(e.Tick(30.0, 30.0))
    assert of(e.Schedule, out) == [e.Schedule(1, 0)]
    states = {c.run_id: c.state for c in of(e.MarkEnded, out)}  # type: ignore[attr-defined]
    assert states == {2: LOST, 3: CANCELLED}
    assert life.failures == 1


def test_a_copy_running_elsewhere_is_stopped(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w2", "", 42, 1.0, 1.0))
    out = life.handle(e.WorkerBack("peer-1", "w1", (1,), {1: "processing"}, 2.0, 2.0))
    assert out == [e.StopStrays("peer-1", (1,))]


def test_reports_for_runs_not_served_are_ignored(life: RunLifecycle) -> None:
    assert life.handle(e.Started(5, "w1", "", 1, 0.0, 0.0)) == []
    assert life.handle(ended(5)) == []
    assert life.handle(e.TaskDone(5, None, 0.0, 0.0)) == []
    assert life.handle(e.Polled((), (5,), 0.0, 0.0)) == []


# --- preempted runs ------------------------------------------------------------------

WHY = "preempted for share 'bob', which waited 1.0s below its fair share for GPU=1"


def test_a_preempted_run_is_requeued_as_preempted_and_starts_again(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1, retries=0),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "GPU=1", 42, 1.0, 1.0))
    out = life.handle(e.Preempted(1, "w1", WHY, 2.0, 2.0))
    assert out == [e.Note(1, f"stopping it on w1: {WHY}", 2.0)]
    assert life.runs[1].state == RUNNING  # until its processes are gone
    out = life.handle(ended(1, "preempted", "preempted; stopped with SIGTERM"))
    why = f"{WHY} (preempted; stopped with SIGTERM)"
    assert of(e.Requeue, out) == [e.Requeue(1, why, 1.0, preempted=True)]
    assert life.runs[1].state == QUEUED and life.runs[1].preemptions == 1
    out = life.handle(e.Started(1, "w1", "GPU=1", 43, 3.0, 3.0))
    assert of(e.Requeue, out) == []  # not a retry: queued already
    assert of(e.NewAttempt, out) == [e.NewAttempt(1, 1)]  # its log goes on after attempt 1's
    assert life.runs[1].attempts == 2
    assert life.runs[1].retries_left() == 0
    life.handle(ended(1))
    out = life.handle(e.TaskDone(1, None, 4.0, 4.0))
    assert of(e.MarkEnded, out)[0].state == COMPLETED  # type: ignore[attr-defined]
    assert life.failures == 0


def test_a_preempted_attempt_uses_no_retry_after_a_restart() -> None:
    life = RunLifecycle(adopt_grace=30.0)
    queued = view(1, retries=1, attempts=3, preemptions=2)  # one failed attempt, two preempted
    out = life.handle(e.Resumed((queued,), (), 0.0, 0.0))
    assert of(e.Schedule, out) == [e.Schedule(1, 0)]
    running = view(2, RUNNING, retries=0, attempts=2, preemptions=1, worker="w1")
    life.handle(e.Resumed((), (running,), 0.0, 0.0))
    out = life.handle(e.WorkerBack("w1b", "w1", (2,), {}, 1.0, 1.0))
    assert of(e.Adopt, out) == [e.Adopt("w1b", 2, 0, "")]
    check_invariants(life)


def test_a_run_that_completes_while_being_preempted_completes(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(e.Preempted(1, "w1", WHY, 2.0, 2.0))
    assert of(e.Requeue, life.handle(ended(1))) == []
    out = life.handle(e.TaskDone(1, None, 3.0, 3.0))
    assert of(e.MarkEnded, out)[0].state == COMPLETED  # type: ignore[attr-defined]
    assert not life.preempting


def test_a_run_cancelled_while_being_preempted_ends_cancelled(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(e.Preempted(1, "w1", WHY, 2.0, 2.0))
    life.handle(e.Polled((), (1,), 2.5, 2.5))
    life.handle(e.TaskDone(1, ("cancelled", ""), 2.6, 2.6))
    out = life.handle(ended(1, "cancelled", "cancelled; stopped with SIGTERM"))
    assert of(e.Requeue, out) == []
    assert of(e.MarkEnded, out)[0].state == CANCELLED  # type: ignore[attr-defined]


def test_a_preempted_run_whose_worker_leaves_is_requeued_once(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(e.Preempted(1, "w1", WHY, 2.0, 2.0))
    out = life.handle(e.WorkerGone("w1", 3.0, 3.0))
    assert of(e.Requeue, out) == [e.Requeue(1, "its worker w1 left", 3.0)]
    assert not life.preempting and life.runs[1].preemptions == 0


def test_a_run_that_fails_by_itself_while_being_preempted_is_a_failure(
    life: RunLifecycle,
) -> None:
    # It exited non-zero before the stop's signal was sent: its worker says "failed".
    life.handle(e.Submitted((view(1, retries=1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(e.Preempted(1, "w1", WHY, 2.0, 2.0))
    assert of(e.Requeue, life.handle(ended(1, "failed", "exit code 3"))) == []
    assert not life.preempting
    out = life.handle(e.Started(1, "w1", "", 43, 3.0, 3.0))  # the scheduler's retry
    why = "attempt 1 ended: exit code 3; retrying"
    assert of(e.Requeue, out) == [e.Requeue(1, why, 3.0)]
    assert life.runs[1].preemptions == 0 and life.runs[1].attempts == 2
    life.handle(ended(1, "failed", "exit code 3"))
    out = life.handle(e.TaskDone(1, ("failed", ""), 4.0, 4.0))
    assert of(e.MarkEnded, out)[0].state == FAILED  # type: ignore[attr-defined]


def test_a_run_adopted_during_its_preemption_is_requeued_as_preempted(
    life: RunLifecycle,
) -> None:
    # The scheduler restarted while the run was being stopped: this lifecycle never
    # heard of the stop, but the worker says the run's end was a preemption.
    running = view(1, RUNNING, attempts=1, retries=0, worker="w1")
    life.handle(e.Resumed((), (running,), 0.0, 0.0))
    life.handle(e.WorkerBack("peer-1", "w1", (1,), {}, 1.0, 1.0))
    out = life.handle(ended(1, "preempted", "preempted; stopped with SIGTERM"))
    why = f"{PREEMPTED_BEFORE_RESTART} (preempted; stopped with SIGTERM)"
    assert of(e.Requeue, out) == [e.Requeue(1, why, 1.0, preempted=True)]
    assert life.runs[1].preemptions == 1 and life.failures == 0
    # Said again (a worker's notes may come twice): heard once.
    assert life.handle(ended(1, "preempted", "preempted; stopped with SIGTERM")) == []
    out = life.handle(e.Started(1, "w1", "", 43, 3.0, 3.0))  # the scheduler ran it again
    assert of(e.NewAttempt, out) == [e.NewAttempt(1, 1)]
    assert of(e.Requeue, out) == []
    life.handle(ended(1))
    out = life.handle(e.TaskDone(1, None, 4.0, 4.0))
    assert of(e.MarkEnded, out)[0].state == COMPLETED  # type: ignore[attr-defined]
    assert life.failures == 0


def test_a_preemption_heard_before_its_adoption_is_counted_as_one(life: RunLifecycle) -> None:
    # Its worker was declared lost (run requeued), came back with the run ended
    # preempted, and the run was adopted: the next start is attempt 2, preempted.
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    life.handle(e.Started(1, "w1", "", 42, 1.0, 1.0))
    life.handle(e.WorkerGone("w1", 2.0, 2.0))
    life.handle(ended(1, "preempted", "preempted; stopped with SIGTERM"))
    life.handle(e.WorkerBack("peer-1", "w1", (1,), {1: "queued"}, 3.0, 3.0))
    assert life.runs[1].state == RUNNING
    out = life.handle(e.Started(1, "w1", "", 43, 4.0, 4.0))
    [requeue] = of(e.Requeue, out)
    assert requeue.preempted  # type: ignore[attr-defined]
    assert of(e.NewAttempt, out) == [e.NewAttempt(1, 2)]
    assert life.runs[1].preemptions == 1


def test_a_run_not_adopted_uses_no_retry_for_its_preempted_attempts(
    life: RunLifecycle,
) -> None:
    # Each ran twice and has one retry: the first's first attempt was preempted, so
    # losing its second (its worker gone) uses its retry; the other's are both spent.
    preempted = view(1, RUNNING, attempts=2, preemptions=1, retries=1, worker="w1")
    failed = view(2, RUNNING, attempts=2, preemptions=0, retries=1, worker="w1")
    life.handle(e.Resumed((), (preempted, failed), 0.0, 0.0))
    out = life.handle(e.Tick(30.0, 30.0))
    assert of(e.Schedule, out) == [e.Schedule(1, 0)]
    assert of(e.Requeue, out) == [e.Requeue(1, NOT_BACK, 30.0)]
    assert [(c.run_id, c.state) for c in of(e.MarkEnded, out)] == [(2, LOST)]  # type: ignore[attr-defined]


def test_a_preemption_of_a_run_not_running_is_ignored(life: RunLifecycle) -> None:
    life.handle(e.Submitted((view(1),), 0.0, 0.0))
    assert life.handle(e.Preempted(1, "w1", WHY, 1.0, 1.0)) == []
    assert life.handle(e.Preempted(7, "w1", WHY, 1.0, 1.0)) == []


# --- no accepted run is ever lost -------------------------------------------------


class FakeJournal:
    """Applies the lifecycle's journal commands along the transition table."""

    def __init__(self) -> None:
        self.states: dict[int, str] = {}
        self.attempts: dict[int, int] = {}
        self.retries: dict[int, int] = {}
        self.preemptions: dict[int, int] = {}
        self.worker: dict[int, str] = {}
        self.cancel: set[int] = set()
        self.ended_times: dict[int, int] = {}

    def apply(self, commands: list[e.Command]) -> None:
        for command in commands:
            match command:
                case e.MarkQueued():
                    for run_id in command.run_ids:
                        self._move(run_id, QUEUED)
                case e.MarkRunning():
                    self._move(command.run_id, RUNNING)
                    self.attempts[command.run_id] += 1
                    self.worker[command.run_id] = command.worker
                case e.Requeue():
                    self._move(command.run_id, QUEUED)
                    if command.preempted:
                        self.preemptions[command.run_id] = (
                            self.preemptions.get(command.run_id, 0) + 1
                        )
                case e.MarkEnded():
                    self._move(command.run_id, command.state)
                    self.ended_times[command.run_id] = self.ended_times.get(command.run_id, 0) + 1
                case _:
                    pass

    def _move(self, run_id: int, new: str) -> None:
        check_run_move(run_id, self.states[run_id], new)
        self.states[run_id] = new

    def view(self, run_id: int) -> RunView:
        return RunView(
            run_id,
            str(run_id),
            self.states[run_id],
            self.attempts[run_id],
            self.retries[run_id],
            preemptions=self.preemptions.get(run_id, 0),
            worker=self.worker.get(run_id, ""),
            cancel_requested=run_id in self.cancel,
        )


WORKERS = ("w1", "w2")
FAILURES = st.sampled_from(
    [None, ("failed", "boom"), ("cancelled", ""), ("lost", "gone"), ("crashed", "SIGKILL")]
)


class NoRunIsLost(RuleBasedStateMachine):
    """Any order of events, restarts included: every accepted run is either served
    (queued or running) or ended exactly once in a final state."""

    def __init__(self) -> None:
        super().__init__()
        self.journal = FakeJournal()
        self.life = RunLifecycle(adopt_grace=5.0)
        self.now = 0.0
        self.next_id = 1

    def _apply(self, event: e.Event) -> None:
        self.journal.apply(self.life.handle(event))

    @rule(retries=st.integers(0, 2), staged=st.booleans())
    def accept(self, retries: int, staged: bool) -> None:
        run_id, self.next_id = self.next_id, self.next_id + 1
        self.journal.states[run_id] = STAGED if staged else QUEUED
        self.journal.attempts[run_id] = 0
        self.journal.retries[run_id] = retries
        if staged:
            self._apply(e.Polled((self.journal.view(run_id),), (), self.now, self.now))
        else:
            self._apply(e.Submitted((self.journal.view(run_id),), self.now, self.now))

    def _some(self, data: st.DataObject) -> int | None:
        ids = sorted(self.life.runs)
        return data.draw(st.sampled_from(ids)) if ids else None

    @precondition(lambda self: bool(self.life.runs))
    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def start(self, data: st.DataObject, worker: str) -> None:
        run_id = self._some(data)
        assert run_id is not None
        self._apply(e.Started(run_id, worker, "", 1, self.now, self.now))

    @precondition(lambda self: bool(self.life.runs))
    @rule(data=st.data(), completed=st.booleans())
    def end(self, data: st.DataObject, completed: bool) -> None:
        run_id = self._some(data)
        assert run_id is not None
        reasons = ["failed", "cancelled", "preempted"]
        reason = "completed" if completed else data.draw(st.sampled_from(reasons))
        self._apply(e.Ended(run_id, 0, 0, reason, "", self.now, self.now))

    @precondition(lambda self: bool(self.life.runs))
    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def preempt(self, data: st.DataObject, worker: str) -> None:
        run_id = self._some(data)
        assert run_id is not None
        self._apply(e.Preempted(run_id, worker, "preempted", self.now, self.now))

    @precondition(lambda self: bool(self.life.runs))
    @rule(data=st.data(), failure=FAILURES)
    def task_done(self, data: st.DataObject, failure: e.Failure) -> None:
        run_id = self._some(data)
        assert run_id is not None
        self._apply(e.TaskDone(run_id, failure, self.now, self.now))

    @precondition(lambda self: bool(self.life.runs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        run_id = self._some(data)
        assert run_id is not None
        self.journal.cancel.add(run_id)
        self._apply(e.Polled((), (run_id,), self.now, self.now))

    @rule(worker=st.sampled_from(WORKERS))
    def worker_gone(self, worker: str) -> None:
        self._apply(e.WorkerGone(worker, self.now, self.now))

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def worker_back(self, worker: str, data: st.DataObject) -> None:
        known = sorted(self.journal.states)
        live = data.draw(st.lists(st.sampled_from(known), unique=True)) if known else []
        task_states = {
            run_id: data.draw(st.sampled_from(["queued", "processing"]))
            for run_id in live
            if run_id in self.life.active
        }
        self._apply(e.WorkerBack(f"peer-{worker}", worker, tuple(live), task_states, 0, 0))

    @rule(seconds=st.floats(0.0, 10.0))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self._apply(e.Tick(self.now, self.now))

    @rule()
    def restart(self) -> None:
        """The scheduler dies and a new one resumes from the journal."""
        self.life = RunLifecycle(adopt_grace=5.0)
        states = self.journal.states
        queued = tuple(self.journal.view(i) for i in sorted(states) if states[i] == QUEUED)
        running = tuple(self.journal.view(i) for i in sorted(states) if states[i] == RUNNING)
        self._apply(e.Resumed(queued, running, self.now, self.now))

    @invariant()
    def every_run_is_served_or_ended_once(self) -> None:
        check_invariants(self.life)
        for run_id, state in self.journal.states.items():
            if state in FINISHED:
                assert run_id not in self.life.runs, f"run {run_id} {state} but still served"
                assert self.journal.ended_times[run_id] == 1, f"run {run_id} ended twice"
            elif state != STAGED:
                assert run_id in self.life.runs, f"run {run_id} {state} but forgotten"
                assert self.life.runs[run_id].state == state, f"run {run_id} views differ"
                served = self.life.runs[run_id].preemptions
                assert served == self.journal.preemptions.get(run_id, 0), (
                    f"run {run_id} preemptions"
                )


NoRunIsLost.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_no_run_is_lost = NoRunIsLost.TestCase
