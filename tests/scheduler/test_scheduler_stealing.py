"""Work stealing, decision by decision, on the simulated cluster with simulated time.

Each test builds the same picture: a task queued on a busy worker behind one that
runs long, while another worker's thread idles; then it plays the busy worker's
answer, or what crosses it (the task starting, finishing, the worker dying, the
task cancelled), and checks that the task runs exactly once, somewhere, and that
every resource comes back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from apportion.protocol.tasks import CancelKeys, KeysFailed, KeysPending, SubmitTasks, TaskSpec
from apportion.protocol.worker import ComputeTask, Heartbeat, StealRequest, WorkerClosing
from apportion.scheduler.events import Tick
from apportion.scheduler.explain import explain
from apportion.scheduler.records import ERRED, MEMORY, QUEUED
from apportion.testing import RecordingCluster


@pytest.fixture
def sim(make_sim: Callable[..., RecordingCluster]) -> RecordingCluster:
    """Workers answer steal requests only as each test says."""
    return make_sim(answers_steals=False)


def _queued_behind_a_blocker(
    sim: RecordingCluster, resources: str | None = None
) -> tuple[str, str]:
    """Worker ``busy`` runs ``blocker`` with ``short-1`` queued behind it; worker
    ``spare`` runs ``short-0``. Both are expected to take a millisecond."""
    busy = sim.add_worker("busy", resources=resources)
    idle = sim.add_worker("spare", resources=resources)
    sim.measured("short-0", 0.001)
    sim.measured("blocker", 0.001)
    sim.submit("blocker")
    sim.submit("short-0")
    sim.submit("short-1")
    assert sim.place() == [(busy, "blocker"), (idle, "short-0"), (busy, "short-1")]
    return busy, idle


def _short_1_asked_for(sim: RecordingCluster) -> tuple[str, str]:
    """``short-1`` waits behind ``blocker``, which has run five seconds where a
    millisecond was expected; the spare worker just idled: ``busy`` is asked for it."""
    busy, spare = _queued_behind_a_blocker(sim)
    sim.now = 5.0
    sim.finish("short-0")
    sim.place()
    assert _steal_asked(sim, busy) == ["short-1"]
    return busy, spare


def _steal_asked(sim: RecordingCluster, worker: str) -> list[str]:
    return [key for msg in sim.worker_got(worker, StealRequest) for key in msg.keys]


def test_a_task_waiting_behind_a_long_one_moves_to_an_idle_worker(sim: RecordingCluster) -> None:
    busy, idle = _queued_behind_a_blocker(sim)
    sim.now = 5.0  # the blocker runs far past its millisecond: it is expected to run on
    sim.finish("short-0")
    assert sim.place() == []
    assert _steal_asked(sim, busy) == ["short-1"]
    assert sim.state.workers[idle].incoming == 1
    assert "being moved to idle spare" in explain(sim.state, "short-1")
    assert sim.place() == []  # the idle thread is promised: nothing else is asked
    assert _steal_asked(sim, busy) == ["short-1"]
    sim.answer_steal(busy, released=["short-1"])
    assert sim.worker_of("short-1") == idle
    assert sim.worker_got(idle, ComputeTask)[-1].key == "short-1"
    causes = [cause for *_, cause in sim.state.story("short-1")]
    assert any(c.startswith("asked busy to let it go to idle spare") for c in causes)
    assert causes[-2:] == [
        "let go by busy before it started there",
        "moved from busy, where it waited, to idle spare",
    ]
    sim.finish("short-1")
    sim.finish("blocker")
    assert sorted(sim.done()) == ["blocker", "short-0", "short-1"]  # each once


def test_nothing_moves_while_the_wait_is_shorter_than_the_move(sim: RecordingCluster) -> None:
    busy, _ = _queued_behind_a_blocker(sim)
    sim.now = 0.0005  # the blocker should end within a millisecond: the task waits
    sim.finish("short-0")
    sim.place()
    assert _steal_asked(sim, busy) == []
    sim.handle(Tick(1.0))  # a second later it has not: now it is worth moving
    sim.now = 1.0
    assert _steal_asked(sim, busy) == ["short-1"]
    sim.answer_steal(busy, started=["short-1"])  # it had started meanwhile
    sim.finish("short-1")
    sim.finish("blocker")
    assert sorted(sim.done()) == ["blocker", "short-0", "short-1"]


def test_a_task_that_had_started_stays_and_is_not_asked_for_again(
    sim: RecordingCluster,
) -> None:
    busy, idle = _short_1_asked_for(sim)
    # It was the other way round: short-1 started, the blocker waits for it.
    sim.answer_steal(busy, started=["short-1"])
    assert sim.state.workers[idle].incoming == 0
    assert "short-1" in sim.state.workers[busy].started
    assert sim.state.story("short-1")[-1][-1] == "had started on busy; stays"
    sim.handle(Tick(6.0))
    sim.now = 6.0
    assert _steal_asked(sim, busy) == ["short-1", "blocker"]  # now the blocker waits
    sim.answer_steal(busy, released=["blocker"])
    assert sim.worker_of("blocker") == idle
    sim.worker_got(idle, ComputeTask)
    sim.finish("blocker")
    sim.finish("short-1")
    assert sorted(sim.done()) == ["blocker", "short-0", "short-1"]


def test_a_task_that_finishes_while_asked_for_finishes_once(sim: RecordingCluster) -> None:
    busy, idle = _short_1_asked_for(sim)
    sim.finish("blocker")
    sim.finish("short-1")  # reported before the request arrived: answered with neither
    assert sim.state.steals == {} and sim.state.workers[idle].incoming == 0
    sim.answer_steal(busy)
    assert sim.state_of("short-1") == MEMORY
    assert sorted(sim.done()) == ["blocker", "short-0", "short-1"]


def test_a_task_let_go_by_a_worker_that_is_then_lost_is_not_lost(
    sim: RecordingCluster,
) -> None:
    busy, idle = _short_1_asked_for(sim)
    sim.remove_worker(busy)  # dies before its answer arrives
    assert sim.state.steals == {} and sim.state.workers[idle].incoming == 0
    assert sorted(k for _, k in sim.place()) == ["blocker", "short-1"]
    assert set(sim.running[idle]) == {"blocker", "short-1"}
    sim.finish("short-1")
    sim.finish("blocker")
    assert sorted(sim.done()) == ["blocker", "short-0", "short-1"]


def test_a_task_let_go_for_a_worker_that_left_is_queued_again(sim: RecordingCluster) -> None:
    busy, idle = _short_1_asked_for(sim)
    sim.remove_worker(idle)  # short-0's result goes with it: computed again
    sim.answer_steal(busy, released=["short-1"])
    assert sim.state_of("short-1") == QUEUED  # nobody else: it waits in the scheduler
    sim.finish("blocker")
    assert sorted(sim.place()) == [(busy, "short-0"), (busy, "short-1")]
    sim.finish("short-0")
    sim.finish("short-1")
    assert sim.got(KeysPending) == [KeysPending(["short-0"])]
    assert sorted(sim.done()) == ["blocker", "short-0", "short-0", "short-1"]


def test_a_task_cancelled_while_asked_for_is_settled_as_cancelled(
    sim: RecordingCluster,
) -> None:
    sim.allow(KeysFailed)
    busy, idle = _short_1_asked_for(sim)
    sim.client_says("c1", CancelKeys(["short-1"]))
    assert sim.freed(busy) == ["short-1"]
    sim.answer_steal(busy, released=["short-1"])  # let go before the free came
    assert sim.state_of("short-1") in (ERRED, "forgotten")
    assert sim.state.workers[idle].incoming == 0
    assert "short-1" not in sim.running[idle]
    sim.finish("blocker")
    assert sorted(sim.done()) == ["blocker", "short-0"]


def test_a_resource_task_moves_with_its_resources_given_back_then_taken(
    sim: RecordingCluster,
) -> None:
    busy = sim.add_worker("busy", nthreads=2, resources="GPU=1")
    idle = sim.add_worker("idle", nthreads=1, resources="GPU=1")
    sim.submit("gpu-0", resources="GPU=1")
    sim.submit("cpu-0")
    assert sorted(sim.place()) == [(busy, "gpu-0"), (idle, "cpu-0")]
    # The busy worker pauses for its memory before gpu-0 starts: it starts nothing now.
    sim.worker_says(busy, Heartbeat(1, paused=1))
    sim.finish("cpu-0")
    sim.place()
    assert _steal_asked(sim, busy) == ["gpu-0"]
    assert sim.free(busy) == {"GPU": 0.0}  # still held there until it is let go
    sim.answer_steal(busy, released=["gpu-0"])
    assert sim.free(busy) == {"GPU": 1.0}
    assert sim.free(idle) == {"GPU": 0.0}
    assert sim.worker_of("gpu-0") == idle
    sim.worker_got(idle, ComputeTask)
    sim.finish("gpu-0")
    assert sim.free(idle) == {"GPU": 1.0}
    assert sorted(sim.done()) == ["cpu-0", "gpu-0"]


def test_actors_never_move(sim: RecordingCluster) -> None:
    busy = sim.add_worker("busy")
    spare = sim.add_worker("spare")
    sim.measured("short-0", 0.001)
    sim.measured("blocker", 0.001)
    sim.submit("blocker")
    sim.submit("short-0")
    sim.submit("short-1", actor=True)
    assert sim.place() == [(busy, "blocker"), (spare, "short-0"), (busy, "short-1")]
    sim.now = 5.0
    sim.finish("short-0")
    sim.place()
    assert _steal_asked(sim, busy) == []
    assert "waiting there behind other tasks" in explain(sim.state, "short-1")
    sim.finish("blocker")
    sim.finish("short-1")
    assert sorted(sim.done()) == ["blocker", "short-0", "short-1"]


def test_a_task_restricted_to_its_worker_never_moves(sim: RecordingCluster) -> None:
    busy = sim.add_worker("busy", nthreads=2)
    spare = sim.add_worker("spare")
    sim.client_says(
        "c1",
        SubmitTasks([TaskSpec("pinned", "f", b"", [], {}, 0, 0, workers=["busy"])], {}, ["pinned"]),
    )
    sim.submit("other")
    sim.submit("loose")
    assert sim.place() == [(busy, "pinned"), (spare, "other"), (busy, "loose")]
    # It pauses for its memory before starting either: both wait there for now.
    sim.worker_says(busy, Heartbeat(0, paused=1))
    sim.finish("other")
    sim.place()
    assert _steal_asked(sim, busy) == ["loose"]  # the one that may run elsewhere
    sim.answer_steal(busy, released=["loose"])
    assert sim.worker_of("loose") == spare
    sim.worker_got(spare, ComputeTask)
    sim.finish("loose")
    sim.finish("pinned")
    assert sorted(sim.done()) == ["loose", "other", "pinned"]


def test_a_task_that_waited_in_the_queue_is_not_judged_by_its_wait(
    sim: RecordingCluster,
) -> None:
    busy, spare = _queued_behind_a_blocker(sim)
    sim.submit("short-2")
    sim.submit("short-3")
    assert sim.place() == [(spare, "short-2"), (busy, "short-3")]
    sim.now = 5.0
    sim.finish("blocker")  # short-1 starts now, after five seconds in the queue
    sim.now = 5.0005
    sim.finish("short-0")
    sim.finish("short-2")  # the spare worker idles
    sim.place()
    # short-1 is expected to end within the millisecond: short-3 stays where it is.
    assert _steal_asked(sim, busy) == []
    sim.finish("short-1")
    sim.finish("short-3")
    assert sorted(sim.done()) == ["blocker", "short-0", "short-1", "short-2", "short-3"]


def test_a_task_let_go_for_a_worker_now_closing_is_queued_again(sim: RecordingCluster) -> None:
    busy = sim.add_worker("busy", resources="GPU=1")
    spare = sim.add_worker("spare", resources="GPU=1")
    sim.submit("gpu-0", resources="GPU=1")
    sim.submit("cpu-0")
    assert sorted(sim.place()) == [(busy, "gpu-0"), (spare, "cpu-0")]
    sim.worker_says(busy, Heartbeat(0, paused=1))  # before gpu-0 starts
    sim.finish("cpu-0")
    sim.place()
    assert _steal_asked(sim, busy) == ["gpu-0"]
    sim.worker_says(spare, WorkerClosing("scaled down"))
    sim.answer_steal(busy, released=["gpu-0"])
    assert sim.state_of("gpu-0") == QUEUED  # not sent to a worker on its way out
    assert sim.free(busy) == {"GPU": 1.0} and sim.free(spare) == {"GPU": 1.0}
    sim.worker_says(busy, Heartbeat(0, paused=0))
    assert sim.place() == [(busy, "gpu-0")]
    sim.finish("gpu-0")
    assert sorted(sim.done()) == ["cpu-0", "gpu-0"]


def test_a_task_moves_to_the_idle_worker_holding_its_inputs_not_the_first_idle(
    sim: RecordingCluster,
) -> None:
    """Of the idle workers, the one whose missing inputs are fewest bytes takes the
    task, though another idle worker comes first (the walk looks only at those
    holding an input, and at the first holding none)."""
    busy = sim.add_worker("busy")
    early = sim.add_worker("early")
    holder = sim.add_worker("holder")
    for key in ("x1", "x2", "f-0", "blocker", "use"):
        sim.measured(key, 0.001)
    sim.submit("x1")
    assert sim.place() == [(busy, "x1")]
    sim.finish("x1", nbytes=1_000)
    for key in ("f-0", "f-1", "x2"):
        sim.submit(key)
    assert sim.place() == [(busy, "f-0"), (early, "f-1"), (holder, "x2")]
    sim.finish("f-0")
    sim.finish("f-1")
    sim.finish("x2", nbytes=500)
    sim.submit("blocker")
    sim.submit("use", deps=["x1", "x2"])
    assert sim.place() == [(busy, "blocker"), (busy, "use")]  # most input bytes there
    sim.now = 5.0  # the blocker runs far past its millisecond
    sim.place()
    assert _steal_asked(sim, busy) == ["use"]
    assert sim.state.steals["use"] == (busy, holder)
    sim.answer_steal(busy, released=["use"])
    assert sim.worker_of("use") == holder
    assert sim.worker_got(holder, ComputeTask)[-1].key == "use"
    sim.finish("use")
    sim.finish("blocker")
    assert sorted(sim.done()) == ["blocker", "f-0", "f-1", "use", "x1", "x2"]
