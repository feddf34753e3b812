"""Worker failures in the state machine: silent workers, poison tasks, retries, the dump."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from apportion.protocol.base import Message
from apportion.protocol.tasks import KeysFailed, Notice, TaskErred
from apportion.protocol.worker import Heartbeat, TaskFinished, WorkerClosing
from apportion.scheduler import views
from apportion.scheduler.events import FromWorker, Tick
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, MEMORY, QUEUED
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import SimulatedCluster


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster(SchedulerConfig(worker_timeout=10.0, max_worker_deaths=3))
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def got(sim: SimulatedCluster, kind: type[Message]) -> list[Message]:
    return [msg for msg in sim.inbox["c1"] if isinstance(msg, kind)]


def test_a_silent_worker_is_declared_lost_and_its_work_moves(sim: SimulatedCluster) -> None:
    quiet = sim.add_worker("quiet", resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.place()
    talker = sim.add_worker("talker", resources="GPU=1")
    sim.now = 8.0
    sim.handle(FromWorker(talker, [Heartbeat(0)], sim.now))
    sim.handle(Tick(sim.now))
    assert quiet in sim.state.workers  # 8 s of silence: not yet
    sim.now = 12.0
    sim.handle(Tick(sim.now))
    assert quiet not in sim.state.workers and talker in sim.state.workers
    assert sim.disconnected == [quiet]
    assert any("lost worker quiet" in log.text and "silent for 12s" in log.text for log in sim.logs)
    assert sim.place() == [(talker, "x")]


def test_a_lost_worker_that_returns_registers_as_new(sim: SimulatedCluster) -> None:
    w = sim.add_worker("flaky")
    sim.now = 20.0
    sim.handle(Tick(sim.now))
    again = sim.add_worker("flaky")
    assert list(sim.state.workers) == [again]
    # A late message from the old connection finds no record and changes nothing.
    sim.handle(FromWorker(w, [TaskFinished("ghost", 1, 0.1, "int")], sim.now))
    assert list(sim.state.workers) == [again]


def test_a_task_present_at_repeated_worker_deaths_fails_as_the_likely_cause(
    sim: SimulatedCluster,
) -> None:
    sim.submit("poison")
    for i in range(3):
        w = sim.add_worker(f"w{i}")
        assert sim.place() == [(w, "poison")]
        sim.remove_worker(w)  # the connection closes: a crash
    (failed,) = got(sim, KeysFailed)
    assert failed.kind == "crashed" and "3 workers that died" in failed.message
    assert "w0 (its connection closed)" in failed.message
    assert sim.state.tasks["poison"].state == ERRED
    assert not sim.state.deaths


def test_a_graceful_stop_does_not_count_as_a_death(sim: SimulatedCluster) -> None:
    sim.submit("ok")
    for i in range(4):
        w = sim.add_worker(f"w{i}")
        sim.place()
        sim.handle(FromWorker(w, [WorkerClosing("SIGTERM")], sim.now))
        sim.remove_worker(w)
    assert sim.state.tasks["ok"].state == QUEUED
    assert not got(sim, KeysFailed)
    w = sim.add_worker("last")
    sim.place()
    sim.finish("ok")
    assert sim.state.tasks["ok"].state == MEMORY


def test_the_final_exception_says_how_many_attempts(sim: SimulatedCluster) -> None:
    sim.add_worker()
    sim.submit("flaky", retries=2)
    for _ in range(3):
        sim.place()
        sim.raise_("flaky", exception=b"last")
    (erred,) = got(sim, TaskErred)
    assert erred.attempts == 3 and erred.exception == b"last"


def test_the_dump_is_plain_json_with_every_task_and_worker(sim: SimulatedCluster) -> None:
    w = sim.add_worker("gpus", resources="gpu=[0,1]")
    sim.submit("a", resources={"gpu": 1})
    sim.submit("b", deps=["a"])
    sim.place()
    state = json.loads(json.dumps(views.dump(sim.state)))
    assert state["task_states"]["a"]["units"] == {"gpu": ["0"]}
    assert state["task_states"]["b"]["state"] == "waiting"
    assert state["workers"]["sim://" + w]["name"] == "gpus"
    assert state["config"]["worker_timeout"] == 10.0
    assert any(row[1] == "a" and row[3] == "processing" for row in state["log"])


def test_a_worker_that_says_it_is_closing_gets_no_new_tasks(sim: SimulatedCluster) -> None:
    leaving = sim.add_worker("leaving", nthreads=2, resources="GPU=1")
    staying = sim.add_worker("staying", nthreads=1, resources="GPU=1")
    sim.handle(FromWorker(leaving, [WorkerClosing("SIGTERM")], sim.now))
    sim.submit("gpu", resources="GPU=1")
    sim.submit("plain")
    started = sim.place()
    assert {worker for worker, _ in started} == {staying}
    assert not sim.running[leaving]


def test_work_only_a_closing_worker_could_run_waits_quietly(sim: SimulatedCluster) -> None:
    leaving = sim.add_worker("leaving", resources="GPU=1")
    sim.handle(FromWorker(leaving, [WorkerClosing("SIGTERM")], sim.now))
    sim.submit("gpu", resources="GPU=1")
    assert sim.place() == []
    assert not got(sim, Notice) and not got(sim, KeysFailed)
    newcomer = sim.add_worker("newcomer", resources="GPU=1")
    assert sim.place() == [(newcomer, "gpu")]
