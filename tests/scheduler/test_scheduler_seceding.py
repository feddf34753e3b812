"""Seceded tasks in the scheduler: their thread and resources go to others while they
wait, and they take back the same units, first come first served, on rejoin."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from apportion.protocol.tasks import CancelKeys
from apportion.protocol.worker import RejoinGranted, TaskRejoining, TaskSeceded
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, MEMORY, QUEUED
from apportion.testing import SimulatedCluster


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster()
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def grants(sim: SimulatedCluster, worker: str) -> list[str]:
    """Keys the scheduler told ``worker`` to run on, taken from its inbox."""
    inbox = sim.to_workers.get(worker, [])
    granted = [k for msg in inbox if isinstance(msg, RejoinGranted) for k in msg.keys]
    sim.to_workers[worker] = [msg for msg in inbox if not isinstance(msg, RejoinGranted)]
    return granted


def causes(sim: SimulatedCluster, key: str) -> list[str]:
    return [cause for *_, cause in sim.state.story(key)]


def test_a_seceded_task_gives_its_gpu_to_its_subtask_and_takes_it_back(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("parent", resources={"GPU": 1})
    sim.place()
    sim.submit("child", resources={"GPU": 1})
    assert sim.place() == []  # the parent holds the only GPU and thread
    sim.worker_says(w, TaskSeceded("parent", False))
    assert sim.place() == [(w, "child")]
    sim.worker_says(w, TaskRejoining("parent"))
    sim.place()
    assert grants(sim, w) == []  # the child holds the GPU now
    sim.finish("child")
    sim.place()
    assert grants(sim, w) == ["parent"]
    assert sim.state.workers[w].ledger.free == {"GPU": 0}
    sim.finish("parent")
    assert sim.state.workers[w].ledger.free == {"GPU": 10_000}
    assert causes(sim, "parent")[2:5] == [
        "seceded on w1; gave back GPU=1",
        "rejoining; waits for its resources",
        "rejoined on w1; holds its resources again",
    ]


def test_a_task_that_keeps_its_resources_frees_only_its_thread(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("owner", resources={"GPU": 1})
    sim.place()
    sim.submit("gpu-child", resources={"GPU": 1})
    sim.submit("plain-child")
    sim.worker_says(w, TaskSeceded("owner", True))
    assert sim.place() == [(w, "plain-child")]
    sim.worker_says(w, TaskRejoining("owner"))
    sim.place()
    assert grants(sim, w) == []  # it never gave anything back: nothing to grant
    assert "rejoined on w1" in causes(sim, "owner")
    assert sim.state.tasks["gpu-child"].state == QUEUED


def test_a_rejoining_task_is_not_overtaken_by_new_work(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("parent", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w, TaskSeceded("parent", False))
    sim.submit("child", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w, TaskRejoining("parent"))
    sim.submit("newcomer", resources={"GPU": 1}, priority=10)
    sim.place()
    sim.finish("child")
    assert sim.place() == []  # the GPU goes back to the parent, not to the newcomer
    assert grants(sim, w) == ["parent"]
    sim.finish("parent")
    assert sim.place() == [(w, "newcomer")]


def test_rejoining_waits_for_the_very_units_it_held(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=4, resources="gpu=[0,1]")
    sim.submit("parent", resources={"gpu": 1})
    sim.place()
    assert sim.running[w]["parent"].allocation.units == {"gpu": ["0"]}
    sim.worker_says(w, TaskSeceded("parent", False))
    sim.submit("on-0", resources={"gpu": 1})
    sim.submit("on-1", resources={"gpu": 1})
    sim.place()
    assert sim.running[w]["on-0"].allocation.units == {"gpu": ["0"]}
    sim.worker_says(w, TaskRejoining("parent"))
    sim.finish("on-1")
    sim.place()
    assert grants(sim, w) == []  # unit 1 is free, but its state is on unit 0
    sim.finish("on-0")
    sim.place()
    assert grants(sim, w) == ["parent"]
    assert sim.state.workers[w].ledger.units["gpu"] == {"0": 0, "1": 10_000}


def test_a_task_that_gave_nothing_back_rejoins_at_once_and_may_exceed_the_threads(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=3")
    sim.submit("a", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w, TaskSeceded("a", True))
    sim.submit("b", resources={"GPU": 1})
    assert sim.place() == [(w, "b")]
    sim.worker_says(w, TaskRejoining("a"))
    assert grants(sim, w) == []
    worker = sim.state.workers[w]
    assert worker.running() == 2 > worker.nthreads  # briefly over, as Dask allows
    sim.submit("c", resources={"GPU": 1})
    assert sim.place() == []  # a GPU is free, but no thread
    sim.finish("a")
    sim.finish("b")
    assert sim.place() == [(w, "c")]


def test_a_task_may_end_seceded_and_gives_nothing_back_twice(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=2")
    sim.submit("a", resources={"GPU": 1})
    sim.submit("b", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w, TaskSeceded("a", False))
    sim.place()
    sim.finish("a")  # it never rejoined
    sim.worker_says(w, TaskSeceded("b", False))
    sim.worker_says(w, TaskRejoining("b"))
    sim.finish("b")  # finished while waiting for its grant
    sim.place()
    assert grants(sim, w) == []
    assert sim.state.workers[w].ledger.free == {"GPU": 20_000}
    assert sim.state.tasks["a"].state == sim.state.tasks["b"].state == MEMORY


def test_seceded_tasks_of_a_lost_worker_run_again_elsewhere(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("a", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w1, TaskSeceded("a", False))
    sim.submit("b", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w1, TaskRejoining("a"))
    sim.remove_worker(w1)
    w2 = sim.add_worker(nthreads=2, resources="GPU=2")
    assert sorted(sim.place()) == [(w2, "a"), (w2, "b")]


def test_stale_reports_change_nothing(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("a", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w, TaskRejoining("a"))  # never seceded
    sim.worker_says(w, TaskSeceded("nobody", False))
    sim.worker_says(w, TaskSeceded("a", False), TaskSeceded("a", True))  # once counts
    assert sim.state.workers[w].seceded == {"a": True}
    assert sim.state.workers[w].ledger.free == {"GPU": 10_000}


def test_a_cancelled_seceded_task_still_gets_its_units_back_until_it_reports(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("a", resources={"GPU": 1})
    sim.place()
    sim.worker_says(w, TaskSeceded("a", False))
    sim.client_says("c1", CancelKeys(["a"]))
    sim.worker_says(w, TaskRejoining("a"))
    sim.place()
    assert grants(sim, w) == ["a"]  # its code runs on until the worker reports it
    sim.finish("a")
    assert sim.state.workers[w].ledger.free == {"GPU": 10_000}
    assert sim.state.tasks["a"].state == ERRED


# --- the ledger under any interleaving ---------------------------------------------

SUPPLIES = ["GPU=1", "GPU=2", "gpu=[0]", "gpu=[0,1]", "GPU=1 gpu=[0,1,2]", ""]
DEMANDS = [{}, {"GPU": 1}, {"GPU": 0.5}, {"GPU": 2}, {"gpu": 1}, {"gpu": 0.5}, {"gpu": 2}]


class SecedingMachine(RuleBasedStateMachine):
    """Tasks secede (giving back or keeping) and rejoin between submissions, finishes,
    raises, cancels and lost workers: no pool is ever over-committed, a rejoining task
    that could take its units back is never left waiting after a placement pass, and
    every unit comes back in the end."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = SimulatedCluster()
        self.sim.add_client("c1")
        self.n = 0

    @initialize(supplies=st.lists(st.sampled_from(SUPPLIES), min_size=1, max_size=2))
    def workers(self, supplies: list[str]) -> None:
        for supply in supplies:
            self.sim.add_worker(nthreads=1, resources=supply)

    def _seceded(self) -> dict[str, bool]:
        return {k: v for w in self.sim.state.workers.values() for k, v in w.seceded.items()}

    @rule(demand=st.sampled_from(DEMANDS), count=st.integers(1, 3))
    def submit(self, demand: dict[str, float], count: int) -> None:
        for _ in range(count):
            self.n += 1
            self.sim.submit(f"t{self.n}", resources=demand)

    @rule()
    def place(self) -> None:
        self.sim.place()
        for worker in self.sim.state.workers.values():
            if worker.rejoining:
                task = self.sim.state.tasks[worker.rejoining[0]]
                assert task.allocation is not None
                ledger = copy.deepcopy(worker.ledger)
                assert not ledger.take_exactly(task.allocation.resources, task.allocation.units)

    @precondition(lambda self: self.sim.all_running())
    @rule(data=st.data(), keep=st.booleans())
    def secede(self, data: st.DataObject, keep: bool) -> None:
        running = sorted(k for k in self.sim.all_running() if k not in self._seceded())
        if running:
            key = data.draw(st.sampled_from(running))
            self.sim.worker_says(self.sim.worker_of(key), TaskSeceded(key, keep))

    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        seceded = sorted(self._seceded())
        if seceded:
            key = data.draw(st.sampled_from(seceded))  # again while waiting, sometimes
            self.sim.worker_says(self.sim.worker_of(key), TaskRejoining(key))

    @precondition(lambda self: self.sim.all_running())
    @rule(data=st.data(), ok=st.booleans())
    def finish_or_raise(self, data: st.DataObject, ok: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.sim.all_running())))
        if ok:
            self.sim.finish(key)
        else:
            self.sim.raise_(key)

    @precondition(lambda self: self.n)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        key = f"t{data.draw(st.integers(1, self.n))}"
        self.sim.client_says("c1", CancelKeys([key]))

    @precondition(lambda self: len(self.sim.running) > 1)
    @rule(data=st.data(), supply=st.sampled_from(SUPPLIES))
    def replace_worker(self, data: st.DataObject, supply: str) -> None:
        self.sim.remove_worker(data.draw(st.sampled_from(sorted(self.sim.running))))
        self.sim.add_worker(nthreads=1, resources=supply)

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.sim.state)

    def teardown(self) -> None:
        sim = self.sim
        sim.add_worker(nthreads=4, resources="GPU=2 gpu=[0,1,2]")
        for _ in range(1_000):
            sim.place()
            running = sorted(sim.all_running())
            if not running:
                break
            asking = {k for w in sim.state.workers.values() for k in w.rejoining}
            for key in running:
                if key not in asking:  # a task waiting in rejoin cannot finish
                    sim.finish(key)
            check_invariants(sim.state)
        else:
            raise AssertionError("the cluster did not settle")
        for worker in sim.state.workers.values():
            assert worker.ledger.free == worker.ledger.total, f"{worker.name} lost resources"
            assert not worker.seceded and not worker.rejoining


SecedingMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSeceding = SecedingMachine.TestCase
