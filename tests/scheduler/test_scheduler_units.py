"""Indexed pools in the scheduler: a unit per task, fractions packed, never over-committed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion.protocol.cluster import WhyReply, WhyRequest
from apportion.protocol.tasks import (
    CancelKeys,
    KeysFailed,
    Notice,
    ReleaseKeys,
    SubmitTasks,
    TaskSpec,
)
from apportion.protocol.worker import RegisterWorker
from apportion.scheduler.events import FromWorker
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, Shared
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import SimulatedCluster


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster()
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def units_of(sim: SimulatedCluster, worker: str, key: str) -> list[str]:
    return sim.running[worker][key].allocation.units["gpu"]


def test_concurrent_tasks_get_distinct_units_and_whole_requests_get_several(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker("gpus", nthreads=8, resources="gpu=[0-3]")
    sim.submit("pair", resources={"gpu": 2})
    sim.submit("a", resources={"gpu": 1})
    sim.submit("b", resources={"gpu": 1})
    sim.submit("c", resources={"gpu": 1})  # no unit left
    sim.place()
    held = [units_of(sim, w, k) for k in ("pair", "a", "b")]
    assert held[0] == ["0", "1"]
    assert sorted(u for h in held for u in h) == ["0", "1", "2", "3"]
    assert "c" not in sim.running[w]
    sim.finish("a")
    sim.place()
    assert units_of(sim, w, "c") == held[1]  # the unit "a" gave back


def test_fractions_share_a_unit_and_pack_before_spreading(sim: SimulatedCluster) -> None:
    w = sim.add_worker("gpus", nthreads=8, resources="gpu=[0,1]")
    for i in range(3):
        sim.submit(f"half{i}", resources={"gpu": 0.5})
    sim.place()
    assert [units_of(sim, w, f"half{i}") for i in range(3)] == [["0"], ["0"], ["1"]]
    sim.submit("whole", resources={"gpu": 1})  # unit 1 is half used: no whole unit is free
    sim.place()
    assert "whole" not in sim.running[w]
    sim.finish("half2")
    sim.place()
    assert units_of(sim, w, "whole") == ["1"]


def test_total_free_is_not_enough_when_no_single_unit_has_room(sim: SimulatedCluster) -> None:
    w = sim.add_worker("gpus", nthreads=8, resources="gpu=[0,1]")
    sim.submit("x", resources={"gpu": 0.6})
    sim.submit("y", resources={"gpu": 0.6})
    sim.place()
    assert units_of(sim, w, "x") != units_of(sim, w, "y")
    sim.submit("z", resources={"gpu": 0.5})  # 0.8 free in total, at most 0.4 per unit
    sim.place()
    assert "z" not in sim.running[w]
    sim.client_says("c1", WhyRequest(1, ["z"]))
    (reply,) = [msg for msg in sim.inbox["c1"] if isinstance(msg, WhyReply)]
    assert "no unit with room" in reply.reasons["z"] and "0: 0.4" in reply.reasons["z"]


def test_units_come_back_on_every_exit_path(sim: SimulatedCluster) -> None:
    w = sim.add_worker("gpus", nthreads=8, resources="gpu=[0,1,2]")
    sim.submit("ok", resources={"gpu": 1})
    sim.submit("boom", resources={"gpu": 1})
    sim.submit("cancelled", resources={"gpu": 0.5})
    sim.place()
    sim.finish("ok")
    sim.raise_("boom")
    sim.client_says("c1", CancelKeys(["cancelled"]))
    assert sim.state.workers[w].ledger.units["gpu"] != dict.fromkeys("012", 10_000)  # still held
    sim.finish("cancelled")  # the worker reports; only now is the unit free
    assert sim.state.workers[w].ledger.units["gpu"] == dict.fromkeys("012", 10_000)
    # Released, so that losing the worker below does not recompute "ok" first.
    sim.client_says("c1", ReleaseKeys(["ok", "boom", "cancelled"]))
    sim.submit("lost", resources={"gpu": 2})
    sim.place()
    w2 = sim.add_worker("spare", nthreads=2, resources="gpu=[7,8]")
    sim.remove_worker(w)
    sim.place()
    assert units_of(sim, w2, "lost") == ["7", "8"]


def test_story_and_compute_message_name_the_units(sim: SimulatedCluster) -> None:
    w = sim.add_worker("gpus", nthreads=2, resources="gpu=[4,5]")
    sim.submit("t", resources={"gpu": 2})
    sim.place()
    assert sim.running[w]["t"].allocation.units == {"gpu": ["4", "5"]}
    causes = [row[4] for row in sim.state.story("t")]
    assert "assigned to gpus holding gpu [4,5]" in causes


def test_more_than_one_unit_that_is_not_whole_is_refused(sim: SimulatedCluster) -> None:
    sim.add_worker("gpus", nthreads=2, resources="gpu=[0,1,2]")
    sim.submit("odd", resources={"gpu": 1.5})
    sim.place()
    (notice,) = [msg for msg in sim.inbox["c1"] if isinstance(msg, Notice)]
    assert "gpu is an indexed pool: ask for whole units" in notice.text
    strict = SimulatedCluster(SchedulerConfig(fail_unsatisfiable=True))
    strict.add_client("c1")
    strict.add_worker("gpus", resources="gpu=[0,1,2]")
    strict.submit("odd", resources={"gpu": 1.5})
    (failed,) = [msg for msg in strict.inbox["c1"] if isinstance(msg, KeysFailed)]
    assert failed.kind == "unsatisfiable"


def test_amount_and_indexed_pools_of_other_workers_mix(sim: SimulatedCluster) -> None:
    counted = sim.add_worker("counted", nthreads=2, resources="gpu=2")  # an amount pool
    indexed = sim.add_worker("indexed", nthreads=2, resources="gpu=[0,1]")
    sim.submit("a", resources={"gpu": 2})
    sim.submit("b", resources={"gpu": 2})
    sim.place()
    by_worker = {w: list(sim.running[w]) for w in (counted, indexed)}
    assert sorted(by_worker.values()) == [["a"], ["b"]]
    task_on_indexed = by_worker[indexed][0]
    assert sim.running[indexed][task_on_indexed].allocation.units == {"gpu": ["0", "1"]}
    assert sim.running[counted][by_worker[counted][0]].allocation.units == {}


def test_a_registration_whose_units_do_not_match_its_pool_is_not_trusted(
    sim: SimulatedCluster,
) -> None:
    from apportion.scheduler.events import WorkerJoined

    reg = RegisterWorker("odd", "sim://odd", 1, {"gpu": 30_000}, 0, 0, {"gpu": ["0", "1"]})
    sim.running["odd"] = {}
    sim.handle(WorkerJoined("odd", reg, sim.now))
    assert sim.state.workers["odd"].ledger.units == {}
    assert any("unit lists" in log.text for log in sim.logs)
    sim.handle(FromWorker("odd", [], sim.now))


# --- alternatives (resource variants) -----------------------------------------------


def submit_alternatives(sim: SimulatedCluster, key: str, *alternatives: dict[str, int]) -> None:
    specs = [TaskSpec(key, "f", b"", [], alternatives[0], 0, 0, list(alternatives))]
    sim.client_says("c1", SubmitTasks(specs, {"f": b"func"}, [key]))


def test_the_first_alternative_that_fits_now_is_taken(sim: SimulatedCluster) -> None:
    w = sim.add_worker("box", nthreads=4, resources="gpu=[0] cpus=8")
    gpu_first = ({"gpu": 10_000, "cpus": 10_000}, {"cpus": 40_000})
    submit_alternatives(sim, "a", *gpu_first)
    submit_alternatives(sim, "b", *gpu_first)  # the GPU is taken: runs on 4 CPUs
    sim.place()
    assert sim.running[w]["a"].allocation == ({"gpu": 10_000, "cpus": 10_000}, {"gpu": ["0"]}, 0)
    assert sim.running[w]["b"].allocation == ({"cpus": 40_000}, {}, 1)
    submit_alternatives(sim, "c", *gpu_first)  # neither fits now (3 CPUs left): it waits
    sim.place()
    assert "c" not in sim.running[w]
    sim.client_says("c1", WhyRequest(1, ["c"]))
    (reply,) = [msg for msg in sim.inbox["c1"] if isinstance(msg, WhyReply)]
    assert "none of its 2 alternatives fits anywhere now" in reply.reasons["c"]
    sim.finish("b")
    sim.place()
    assert sim.running[w]["c"].allocation.alternative == 1
    sim.finish("a")
    sim.finish("c")
    assert sim.state.workers[w].ledger.free == {"gpu": 10_000, "cpus": 80_000}


def test_the_tasks_of_a_batch_share_one_demand_and_one_queue(sim: SimulatedCluster) -> None:
    keys = [f"t{i}" for i in range(3)]
    specs = [TaskSpec(key, "f", b"", [], {"gpu": 10_000}, 0, 0) for key in keys]
    sim.client_says("c1", SubmitTasks(specs, {"f": b"func"}, keys))
    assert len({id(sim.state.tasks[key].demand) for key in keys}) == 1
    assert len({id(sim.state.tasks[key].queue) for key in keys}) == 1
    assert list(sim.state.ready) == [Shared(sim.state.tasks["t0"].demand, "c1")]


def test_a_task_reserves_with_the_first_alternative_it_could_ever_run_with(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker("box", nthreads=4, resources="cpus=8")
    submit_alternatives(sim, "busy", {"cpus": 80_000})
    submit_alternatives(sim, "wide", {"gpu": 10_000}, {"cpus": 60_000})
    sim.place()
    task = sim.state.tasks["wide"]
    assert (task.reserved_on, task.choice, task.resources) == (w, 1, {"cpus": 60_000})
    sim.finish("busy")
    sim.place()
    assert sim.running[w]["wide"].allocation == ({"cpus": 60_000}, {}, 1)


def test_alternatives_are_unsatisfiable_only_when_all_are(sim: SimulatedCluster) -> None:
    w = sim.add_worker("cpu-only", nthreads=2, resources="cpus=4")
    submit_alternatives(sim, "flex", {"gpu": 10_000}, {"cpus": 20_000})
    submit_alternatives(sim, "never", {"gpu": 10_000}, {"cpus": 80_000})
    sim.place()
    assert sim.running[w]["flex"].allocation.alternative == 1
    (notice,) = [msg for msg in sim.inbox["c1"] if isinstance(msg, Notice)]
    assert "gives 2 alternatives" in notice.text and "no worker offers gpu" in notice.text
    assert "largest cpus supply is 4" in notice.text


def test_units_of_a_lost_worker_are_not_given_back_elsewhere(sim: SimulatedCluster) -> None:
    gpus = sim.add_worker("gpus", resources="gpu=[0]")
    submit_alternatives(sim, "t", {"gpu": 10_000}, {})
    sim.place()
    assert sim.running[gpus]["t"].allocation.units == {"gpu": ["0"]}
    plain = sim.add_worker("plain")
    sim.remove_worker(gpus)
    assert sim.place() == [(plain, "t")]  # runs with its second alternative: no units
    assert sim.running[plain]["t"].allocation.units == {}
    sim.raise_("t")  # giving back must not touch units of the lost worker
    assert sim.state.tasks["t"].state == ERRED
