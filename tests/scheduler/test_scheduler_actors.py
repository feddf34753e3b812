"""Actors in the scheduler: resources held for the actor's lifetime, never moved,
never recomputed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion.protocol.shared_data import RebalanceKeys, ReplicateKeys
from apportion.protocol.tasks import KeysFailed, KeysPending, ReleaseKeys
from apportion.protocol.worker import FreeKeys, TaskRejoining, TaskSeceded, WorkerDraining
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, MEMORY, PROCESSING, QUEUED
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import SimulatedCluster


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster()
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def freed(sim: SimulatedCluster, worker: str) -> list[str]:
    """Keys ``worker`` was told to drop, taken from its inbox."""
    inbox = sim.to_workers.get(worker, [])
    keys = [k for msg in inbox if isinstance(msg, FreeKeys) for k in msg.keys]
    sim.to_workers[worker] = [msg for msg in inbox if not isinstance(msg, FreeKeys)]
    return keys


def test_an_actor_holds_its_gpu_until_released(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.finish("model")
    sim.submit("other", resources={"GPU": 1})
    assert sim.place() == []  # the actor finished constructing, and keeps the GPU
    assert sim.state.tasks["model"].state == MEMORY
    assert sim.state.workers[w].ledger.free == {"GPU": 0}
    sim.client_says("c1", ReleaseKeys(["model"]))
    assert freed(sim, w) == ["model"]
    assert sim.place() == [(w, "other")]


def test_a_plain_task_gives_its_gpu_back_when_it_finishes(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("plain", resources={"GPU": 1})
    sim.place()
    sim.finish("plain")
    assert sim.state.workers[w].ledger.free == {"GPU": 10_000}


def test_an_actor_keeps_the_same_gpu_unit(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=4, resources="gpu=[0,1]")
    sim.submit("first", resources={"gpu": 1})
    sim.submit("model", resources={"gpu": 1}, actor=True)
    sim.place()
    held = sim.state.tasks["model"].allocation
    assert held is not None
    sim.finish("first")
    sim.finish("model")
    assert sim.state.tasks["model"].allocation == held
    sim.submit("next", resources={"gpu": 1})
    sim.place()
    next_held = sim.state.tasks["next"].allocation
    assert next_held is not None and next_held.units != held.units
    assert sim.state.workers[w].ledger.free == {"gpu": 0}


def test_an_actor_without_resources_takes_no_thread_once_built(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=1)
    sim.submit("counter", actor=True)
    sim.place()
    sim.finish("counter")
    sim.submit("task")
    assert sim.place() == [(w, "task")]


def test_tasks_using_an_actor_run_while_it_holds_its_resources(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.finish("model")
    sim.submit("use", deps=["model"])
    assert sim.place() == [(w, "use")]
    sim.finish("use")
    assert sim.state.workers[w].ledger.free == {"GPU": 0}
    assert sim.state.tasks["model"].state == MEMORY


def test_an_actor_whose_constructor_raises_holds_nothing(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.raise_("model")
    assert sim.state.tasks["model"].state == ERRED
    assert sim.state.workers[w].ledger.free == {"GPU": 10_000}
    assert not sim.state.workers[w].actors


def test_an_actor_released_while_constructing_holds_nothing_after(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.client_says("c1", ReleaseKeys(["model"]))
    assert sim.state.tasks["model"].state == PROCESSING
    sim.finish("model")
    assert "model" not in sim.state.tasks
    assert sim.state.workers[w].ledger.free == {"GPU": 10_000}


def test_an_actor_lost_with_its_worker_fails_and_is_not_rebuilt(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.finish("model")
    w2 = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.remove_worker(w1)
    assert sim.place() == []  # not run again on the new worker
    task = sim.state.tasks["model"]
    assert task.state == ERRED and task.error is not None
    assert "actor 'model' was lost" in str(task.error[1])
    pending = [msg for msg in sim.inbox["c1"] if isinstance(msg, KeysPending)]
    assert pending and pending[-1].keys == ["model"]  # its future waits, then fails
    failed = [msg for msg in sim.inbox["c1"] if isinstance(msg, KeysFailed)]
    assert failed and failed[-1].keys == ["model"] and "not recreated" in failed[-1].message
    assert sim.state.workers[w2].ledger.free == {"GPU": 10_000}


def test_a_task_using_a_lost_actor_fails_too(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker(nthreads=1)
    sim.submit("counter", actor=True)
    sim.place()
    sim.finish("counter")
    sim.submit("use", deps=["counter"])
    sim.place()
    sim.add_worker(nthreads=1)
    sim.remove_worker(w1)
    sim.place()
    assert sim.state.tasks["use"].state == ERRED


def test_an_actor_is_neither_replicated_nor_rebalanced(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker(nthreads=1)
    sim.submit("counter", actor=True)
    sim.place()
    sim.finish("counter", nbytes=10_000)
    sim.add_worker(nthreads=1)
    sim.client_says("c1", ReplicateKeys(1, ["counter"], 0, []))
    sim.client_says("c1", RebalanceKeys(2, [], 1, []))
    sim.answer_transfers()
    assert sim.state.tasks["counter"].replicas is None
    assert sim.state.tasks["counter"].worker == w1


def test_a_draining_worker_says_its_actors_cannot_move(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.finish("model")
    sim.add_worker(nthreads=1)
    sim.worker_says(w1, WorkerDraining(30.0))
    sim.answer_transfers()
    assert any("1 actors cannot move" in log.text for log in sim.logs)
    assert sim.state.tasks["model"].state == ERRED  # failed as the worker left


def test_a_request_behind_a_live_actor_waits_for_it_even_where_nothing_grows() -> None:
    # GPU=2 beside an actor holding 3 of 4 GPUs: not a request nobody can ever meet
    # (the actor's client may let it go at any time), so it neither fails nor is
    # warned about; it starts as soon as the actor is released.
    sim = SimulatedCluster(SchedulerConfig(fail_unsatisfiable=True))
    sim.add_client("c1")
    sim.submit("model", resources={"GPU": 3}, actor=True)
    sim.submit("other", resources={"GPU": 2}, actor=True)
    w = sim.add_worker(nthreads=4, resources="GPU=4")
    assert sim.place() == [(w, "model")]
    sim.finish("model")
    assert sim.place() == []
    assert sim.state.tasks["other"].state == QUEUED
    assert not [log for log in sim.logs if log.level == "warning"]
    sim.client_says("c1", ReleaseKeys(["model"]))
    assert sim.place() == [(w, "other")]
    check_invariants(sim.state)


def test_an_actor_constructor_may_give_its_gpu_to_subtasks_and_rejoin(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.worker_says(w, TaskSeceded("model", False))  # worker_client() in __init__
    sim.submit("sub", resources={"GPU": 1})
    assert sim.place() == [(w, "sub")]
    sim.worker_says(w, TaskRejoining("model"))
    sim.finish("sub")
    sim.place()  # grants the rejoin
    sim.finish("model")
    assert sim.state.tasks["model"].state == MEMORY
    assert sim.state.workers[w].ledger.free == {"GPU": 0}


def test_an_actor_built_while_others_hold_what_it_gave_back_fails(sim: SimulatedCluster) -> None:
    # Its constructor seceded, gave the GPU back and returned without rejoining while
    # another task held it: living on without it would over-commit the GPU.
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("model", resources={"GPU": 1}, actor=True)
    sim.place()
    sim.worker_says(w, TaskSeceded("model", False))
    sim.submit("other", resources={"GPU": 1})
    assert sim.place() == [(w, "other")]
    sim.finish("model")
    task = sim.state.tasks["model"]
    assert task.state == ERRED and task.error is not None and task.error[0] == "lost"
    assert "did not rejoin, while other tasks took them" in str(task.error[1])
    assert freed(sim, w) == ["model"]  # the object it built goes
    assert not sim.state.workers[w].actors
    sim.finish("other")
    assert sim.state.workers[w].ledger.free == {"GPU": 10_000}


def _actor_built(fail_unsatisfiable: bool, supply: str, holds: int) -> tuple[SimulatedCluster, str]:
    """A cluster of one worker with ``supply`` on which actor "model" holds ``holds``
    GPUs, and that worker."""
    sim = SimulatedCluster(SchedulerConfig(fail_unsatisfiable=fail_unsatisfiable))
    sim.add_client("c1")
    w = sim.add_worker(nthreads=4, resources=supply)
    sim.submit("model", resources={"GPU": holds}, actor=True)
    sim.place()
    sim.finish("model")
    return sim, w


def _said_stuck(sim: SimulatedCluster, key: str, gpus: int, fail_unsatisfiable: bool) -> None:
    """``key`` was said to wait for good: failed where the cluster cannot grow, else
    warned about, holding no reservation."""
    said = f"task {key!r} needs GPU={gpus}, which no connected worker can ever provide beside what "
    task = sim.state.tasks[key]
    if fail_unsatisfiable:
        assert task.state == ERRED and task.error is not None and said in str(task.error[1])
    else:
        assert task.state == QUEUED and task.reserved_on is None
        assert [log.text for log in sim.logs if log.level == "warning" and said in log.text]
    check_invariants(sim.state)


@pytest.mark.parametrize("fail_unsatisfiable", [False, True])
def test_a_task_needing_what_its_own_input_actor_holds_is_not_left_silent(
    fail_unsatisfiable: bool,
) -> None:
    # The actor holds 3 of the only 4 GPUs while the task using it waits, and the task
    # needs 2: it can never start. Said so (failed where the cluster cannot grow), and
    # it holds no reservation that would keep the GPU it cannot use from others.
    sim, w = _actor_built(fail_unsatisfiable, "GPU=4", holds=3)
    sim.submit("use", deps=["model"], resources={"GPU": 2})
    sim.submit("small", resources={"GPU": 1})
    assert sim.place() == [(w, "small")]
    _said_stuck(sim, "use", 2, fail_unsatisfiable)


@pytest.mark.parametrize("fail_unsatisfiable", [False, True])
def test_a_task_whose_waiter_keeps_an_actor_holding_what_it_needs_is_not_left_silent(
    fail_unsatisfiable: bool,
) -> None:
    # "join" takes the actor's result and "gpu"'s: the actor holds the only GPU until
    # "join" ends, "join" waits for "gpu", and "gpu" needs the GPU. Nobody's release
    # can end that, so it is said (or failed) rather than left waiting quietly.
    sim, _ = _actor_built(fail_unsatisfiable, "GPU=1", holds=1)
    sim.submit("gpu", resources={"GPU": 1})
    sim.submit("join", deps=["model", "gpu"])
    assert sim.place() == []
    _said_stuck(sim, "gpu", 1, fail_unsatisfiable)
    if fail_unsatisfiable:
        assert sim.state.tasks["join"].state == ERRED


def test_a_task_using_an_actor_that_fits_beside_it_is_not_called_stuck() -> None:
    sim = SimulatedCluster(SchedulerConfig(fail_unsatisfiable=True))
    sim.add_client("c1")
    w = sim.add_worker(nthreads=4, resources="GPU=4")
    sim.submit("model", resources={"GPU": 2}, actor=True)
    sim.submit("busy", resources={"GPU": 2})
    sim.place()
    sim.finish("model")
    sim.submit("use", deps=["model"], resources={"GPU": 2})
    assert sim.place() == []  # waits for "busy", which ends
    assert sim.state.tasks["use"].state == QUEUED
    sim.finish("busy")
    assert sim.place() == [(w, "use")]
