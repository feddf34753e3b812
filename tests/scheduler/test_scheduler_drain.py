"""Draining workers and classified worker deaths, in the state machine alone; then one
drain through the real services, on the in-memory cluster."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator

import pytest

from apportion.protocol.base import Message
from apportion.protocol.peer_data import DataReply, DataStored, GetData, PutData
from apportion.protocol.tasks import CancelKeys, KeysFailed, KeysPending
from apportion.protocol.worker import (
    DrainDone,
    FreeKeys,
    Heartbeat,
    MissingDependency,
    WorkerClosing,
    WorkerDied,
    WorkerDraining,
)
from apportion.scheduler.events import Tick, WorkerDeathReport
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, MEMORY, QUEUED
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import FakeClock, InMemoryCluster, SimulatedCluster
from cli_processes import poll


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster(SchedulerConfig(max_worker_deaths=3, death_report_wait=3.0))
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def sent(sim: SimulatedCluster, worker_id: str, kind: type[Message]) -> list[Message]:
    return [msg for msg in sim.to_workers.get(worker_id, []) if isinstance(msg, kind)]


def got(sim: SimulatedCluster, kind: type[Message]) -> list[Message]:
    return [msg for msg in sim.inbox["c1"] if isinstance(msg, kind)]


def test_a_draining_worker_finishes_its_task_then_hands_its_results_off(
    sim: SimulatedCluster,
) -> None:
    leaving = sim.add_worker("leaving")
    sim.submit("held")
    sim.place()
    sim.finish("held")
    sim.submit("running")
    sim.place()
    staying = sim.add_worker("staying")
    sim.worker_says(leaving, WorkerDraining(30.0))
    sim.submit("new")
    assert sim.place() == [(staying, "new")]  # nothing new for the draining worker
    assert not sent(sim, leaving, GetData)  # "running" still runs there

    sim.finish("running")
    (ask,) = sent(sim, leaving, GetData)
    assert isinstance(ask, GetData) and ask.keys == ["held", "running"]
    sim.worker_says(leaving, DataReply(ask.request_id, {"held": b"1", "running": b"2"}, [], {}))
    (put,) = sent(sim, staying, PutData)
    assert isinstance(put, PutData) and sorted(put.data) == ["held", "running"]
    sim.worker_says(staying, DataStored(put.request_id, ["held", "running"], {}))

    assert sent(sim, leaving, DrainDone) == [DrainDone(2)]
    assert sim.state.tasks["held"].worker == staying
    sim.worker_says(leaving, WorkerClosing("drained"))
    sim.remove_worker(leaving)
    assert not got(sim, KeysPending)  # nothing was lost, nothing runs again
    assert {sim.state.tasks[k].state for k in ("held", "running")} == {MEMORY}
    assert any("handed from leaving to staying" in row[4] for row in sim.state.story("held"))


def test_a_draining_worker_with_nobody_to_take_its_results_is_let_go(
    sim: SimulatedCluster,
) -> None:
    alone = sim.add_worker("alone")
    sim.submit("x")
    sim.place()
    sim.finish("x")
    sim.worker_says(alone, WorkerDraining(5.0))
    assert sent(sim, alone, DrainDone) == [DrainDone(0)]
    assert any("no other worker can take its 1 needed results" in log.text for log in sim.logs)


def test_a_receiver_lost_mid_handoff_does_not_keep_the_drain_waiting(
    sim: SimulatedCluster,
) -> None:
    leaving = sim.add_worker("leaving")
    sim.submit("x")
    sim.place()
    sim.finish("x")
    receiver = sim.add_worker("receiver")
    sim.worker_says(leaving, WorkerDraining(5.0))
    (ask,) = sent(sim, leaving, GetData)
    assert isinstance(ask, GetData)
    sim.worker_says(leaving, DataReply(ask.request_id, {"x": b"1"}, [], {}))
    sim.remove_worker(receiver)
    assert sent(sim, leaving, DrainDone) == [DrainDone(0)]
    assert sim.state.tasks["x"].worker == leaving  # still there, lost only when it goes


def _poison_three_supervised_workers(sim: SimulatedCluster) -> list[str]:
    sim.submit("poison")
    ids = []
    for i in range(3):
        w = sim.add_worker(f"w{i}", pid=100 + i, supervisor=42)
        assert sim.place() == [(w, "poison")]
        sim.remove_worker(w)
        ids.append(w)
    return ids


def test_a_poison_verdict_waits_for_the_supervisor_to_say_how_the_worker_died(
    sim: SimulatedCluster,
) -> None:
    sim.handle(WorkerDeathReport(WorkerDied("w0", 100, "exited with status 1"), sim.now))
    _poison_three_supervised_workers(sim)
    assert not got(sim, KeysFailed)
    assert sim.state.tasks["poison"].state == QUEUED
    assert sim.place() == []  # held: not run on a fourth worker meanwhile
    sim.add_worker("spare")
    assert sim.place() == []

    report = WorkerDied("w2", 102, "was killed by SIGKILL - likely out of memory")
    sim.handle(WorkerDeathReport(report, sim.now))
    (failed,) = got(sim, KeysFailed)
    assert isinstance(failed, KeysFailed) and failed.kind == "crashed"
    assert "w0 (exited with status 1)" in failed.message
    assert "w1 (its connection closed)" in failed.message  # never reported
    assert "w2 (was killed by SIGKILL - likely out of memory)" in failed.message


def test_a_poison_verdict_goes_ahead_when_no_report_comes(sim: SimulatedCluster) -> None:
    _poison_three_supervised_workers(sim)
    sim.now = 2.0
    sim.handle(Tick(sim.now))
    assert not got(sim, KeysFailed)
    sim.now = 3.5
    sim.handle(Tick(sim.now))
    (failed,) = got(sim, KeysFailed)
    assert isinstance(failed, KeysFailed) and "w2 (its connection closed)" in failed.message


def test_a_held_poison_task_that_is_cancelled_leaves_no_verdict(sim: SimulatedCluster) -> None:
    _poison_three_supervised_workers(sim)
    sim.client_says("c1", CancelKeys(["poison"]))
    assert not sim.state.verdicts
    sim.now = 10.0
    sim.handle(Tick(sim.now))
    assert not got(sim, KeysFailed) or all(
        isinstance(f, KeysFailed) and f.kind == "cancelled" for f in got(sim, KeysFailed)
    )


def test_a_worker_lost_near_its_memory_limit_is_likely_out_of_memory(
    sim: SimulatedCluster,
) -> None:
    sim.submit("hog")
    for i in range(3):
        w = sim.add_worker(f"w{i}", memory_limit=1000)
        sim.place()
        sim.worker_says(w, Heartbeat(1, 960))
        sim.remove_worker(w)
    (failed,) = got(sim, KeysFailed)
    assert isinstance(failed, KeysFailed)
    assert "its memory at 96% of its limit - likely out of memory" in failed.message


def test_a_held_poison_task_is_not_placed_through_an_old_heap_entry() -> None:
    sim = SimulatedCluster(SchedulerConfig(max_worker_deaths=1, death_report_wait=3.0))
    sim.add_client("c1")
    r = sim.add_worker("r", nthreads=2, resources="a=2", supervisor=99, pid=11)
    sim.submit("p", resources="a=1")
    sim.place()
    sim.submit("t", resources="a=2")
    sim.place()  # does not fit now: reserves r
    # Submitted after t reserved: behind it, so t keeps the reservation (a task ahead
    # of it, by priority or age, would take it over).
    sim.submit("v", resources="a=2")
    sim.place()
    sim.finish("p")
    sim.place()  # t starts from its reservation
    sim.remove_worker(r)  # t is held for the supervisor's verdict
    assert "t" in sim.state.verdicts
    sim.add_worker("s", nthreads=3, resources="a=6", supervisor=99, pid=12)
    assert "t" not in {key for _, key in sim.place()}
    sim.now += 5
    sim.handle(Tick(sim.now))
    assert sim.state.tasks["t"].state == ERRED
    check_invariants(sim.state)


def test_a_late_handoff_confirmation_keeps_the_receivers_own_copy(
    sim: SimulatedCluster,
) -> None:
    src = sim.add_worker("src")
    sim.submit("k")
    sim.place()
    sim.finish("k")
    sim.submit("busy")
    sim.place()
    rcv = sim.add_worker("rcv")
    sim.worker_says(src, WorkerDraining(30.0))
    sim.finish("busy")
    (ask,) = sent(sim, src, GetData)
    assert isinstance(ask, GetData)
    sim.worker_says(src, DataReply(ask.request_id, {"k": b"1", "busy": b"2"}, [], {}))
    (put,) = sent(sim, rcv, PutData)
    assert isinstance(put, PutData)
    sim.submit("t", deps=["k"])
    sim.place()
    del sim.running[rcv]["t"]
    sim.worker_says(rcv, MissingDependency("t", "k", [f"sim://{src}"], ""))
    sim.place()
    sim.finish("k")  # recomputed on rcv meanwhile
    assert sim.state.tasks["k"].worker == rcv
    before = len(sim.to_workers[rcv])
    sim.worker_says(rcv, DataStored(put.request_id, ["k", "busy"], {"k": 8, "busy": 8}))
    freed = [
        k for msg in sim.to_workers[rcv][before:] if isinstance(msg, FreeKeys) for k in msg.keys
    ]
    assert "k" not in freed


# --- through the services, in memory ------------------------------------------------------

#: Runs by argument: a result computed again would show here.
RUNS: collections.Counter[int] = collections.Counter()
STARTED = threading.Event()
RELEASE = threading.Event()


def square(x: int, gated: bool) -> int:
    RUNS[x] += 1
    if gated:
        STARTED.set()
        RELEASE.wait(10)
    return x * x


def test_a_draining_worker_hands_its_results_to_the_others_and_nothing_runs_again() -> None:
    RUNS.clear()
    STARTED.clear()
    RELEASE.clear()
    clock = FakeClock()  # stands still: the drain ends by DrainDone, never by its grace
    workers = [
        {"name": "leaving", "nthreads": 2, "resources": "here=2"},
        {"name": "staying", "nthreads": 2},
    ]
    with InMemoryCluster(workers, clock=clock) as cluster:
        client = cluster.client()
        held = client.submit(square, 3, False, resources={"here": 1})
        assert held.result(timeout=10) == 9
        running = client.submit(square, 4, True, resources={"here": 1})
        assert STARTED.wait(10)
        leaving = cluster.workers[0]
        # drain() returns once the worker has left: it runs beside this test's thread.
        drain = threading.Thread(target=cluster.run, args=(leaving.drain(30),))
        drain.start()
        record = next(w for w in cluster.scheduler.state.workers.values() if w.name == "leaving")
        deadline = time.monotonic() + 10
        while not record.draining and time.monotonic() < deadline:
            time.sleep(0.001)  # the scheduler learns of the drain by message; nothing signals it
        assert record.draining
        RELEASE.set()  # the task finishes during the drain
        drain.join(10)
        assert not drain.is_alive()
        # The worker has gone; the scheduler hears of its closed connection on its own loop.
        state = cluster.scheduler.state
        poll(lambda: len(state.workers) == 1, 10, "the scheduler to see the worker leave")
        assert sorted(w.name for w in state.workers.values()) == ["staying"]
        assert client.gather([held, running]) == [9, 16]  # from the worker that stayed
        assert RUNS == {3: 1, 4: 1}
        for future in (held, running):
            story = client.story(future)
            assert sum(1 for row in story if row[3] == "processing") == 1, story
            assert any("handed from leaving to staying" in row[4] for row in story), story
