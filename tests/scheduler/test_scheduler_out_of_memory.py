"""Results too large for their workers, in the state machine alone: the worker's verdict,
and holders that die out of memory while serving a result (``scheduler.out_of_memory``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion.protocol.base import Message
from apportion.protocol.tasks import (
    GatherReply,
    GatherRequest,
    KeysFailed,
    KeysPending,
    ReleaseKeys,
)
from apportion.protocol.worker import FreeKeys, Heartbeat, ResultTooLarge, WorkerDied
from apportion.scheduler.events import Tick, WorkerDeathReport
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, QUEUED
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import SimulatedCluster

pytestmark = pytest.mark.timeout(10)

MiB = 2**20
LIMIT = 300 * MiB
BIG = 200 * MiB  # fits in a worker, but not while it is being sent


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster(SchedulerConfig(max_worker_deaths=3, death_report_wait=3.0))
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def got(sim: SimulatedCluster, kind: type[Message]) -> list[Message]:
    return [msg for msg in sim.inbox["c1"] if isinstance(msg, kind)]


def failures(sim: SimulatedCluster) -> dict[str, KeysFailed]:
    failed = [msg for msg in got(sim, KeysFailed) if isinstance(msg, KeysFailed)]
    return {key: msg for msg in failed for key in msg.keys}


# --- the worker's verdict ------------------------------------------------------------


def test_a_result_too_large_for_its_worker_fails_out_of_memory_without_retries(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker("w", memory_limit=LIMIT)
    sim.submit("big", retries=2)  # the same function makes a result of the same size
    sim.submit("total", deps=["big"])
    assert sim.place() == [(w, "big")]
    del sim.running[w]["big"]
    sim.worker_says(w, ResultTooLarge("big", 400 * MiB, "numpy.ndarray", LIMIT, 285 * MiB, 0.5))
    failed = failures(sim)
    assert failed.keys() == {"big", "total"}
    assert failed["big"].kind == failed["total"].kind == "memory"
    text = failed["big"].message
    assert text.startswith("out of memory: the result of 'big' (numpy.ndarray of 400.0 MiB)")
    assert "worker w: its memory limit is 300.0 MiB, and it is killed above 285.0 MiB" in text
    assert "--memory-limit" in text and "memory_limit=" in text and "smaller pieces" in text
    assert sim.state.tasks["big"].state == ERRED
    sim.submit("next")
    assert sim.place() == [(w, "next")]  # the worker goes on


def test_a_too_large_report_for_a_task_released_meanwhile_only_settles_it(
    sim: SimulatedCluster,
) -> None:
    w = sim.add_worker("w", memory_limit=LIMIT)
    sim.submit("big")
    sim.place()
    sim.client_says("c1", ReleaseKeys(["big"]))
    del sim.running[w]["big"]
    sim.worker_says(w, ResultTooLarge("big", 400 * MiB, "bytes", LIMIT, LIMIT, 0.5))
    assert not failures(sim) and "big" not in sim.state.tasks
    assert not sim.state.workers[w].processing


# --- deaths while serving ------------------------------------------------------------


def compute_big(sim: SimulatedCluster, round_: int) -> str:
    """A fresh supervised worker computes "big" (its only copy)."""
    holder = sim.add_worker(
        f"h{round_}", memory_limit=LIMIT, resources="MEM=1", supervisor=42, pid=100 + round_
    )
    assert (holder, "big") in sim.place()
    sim.finish("big", nbytes=BIG)
    assert sim.state.tasks["big"].worker == holder
    return holder


def serve(sim: SimulatedCluster, how: str, holder: str, round_: int) -> None:
    """Make ``holder`` serve "big" the way ``how`` says."""
    if how == "relayed gather":  # the scheduler forwards it from the holder to the client
        sim.client_says("c1", GatherRequest(round_, ["big"]))
        relay = list(sim.state.relays.gathers.values())[-1]
        assert relay.piping == {holder: ["big"]}
    elif how == "direct gather":  # the client fetches it from the holder itself
        sim.client_says("c1", GatherRequest(round_, ["big"], direct_from=MiB))
        reply = got(sim, GatherReply)[-1]
        assert isinstance(reply, GatherReply) and reply.elsewhere == {"big": [f"sim://{holder}"]}
    else:  # a dependent runs on another worker, which fetches it
        assert how == "dependent elsewhere"
        if round_ == 0:
            sim.add_worker("gpu", resources="GPU=1")
            sim.submit("use", deps=["big"], resources="GPU=1")
            assert [k for _, k in sim.place()] == ["use"]
        assert sim.state.tasks["use"].state == "processing"


def serve_from(sim: SimulatedCluster, round_: int) -> str:
    holder = compute_big(sim, round_)
    serve(sim, "direct gather", holder, round_)
    return holder


def die(sim: SimulatedCluster, holder: str, round_: int, *, out_of_memory: bool) -> None:
    sim.remove_worker(holder)
    if out_of_memory:
        how = "was killed by its supervisor: its memory (290.0 MiB) passed 95% ... - out of memory"
    else:
        how = "was killed by SIGKILL"
    report = WorkerDied(f"h{round_}", 100 + round_, how, int(out_of_memory))
    sim.handle(WorkerDeathReport(report, sim.now))


@pytest.mark.parametrize("how", ["relayed gather", "direct gather", "dependent elsewhere"])
def test_a_result_whose_holders_die_out_of_memory_while_serving_it_fails(
    sim: SimulatedCluster, how: str
) -> None:
    sim.submit("big", resources="MEM=1")
    for round_ in range(3):
        holder = compute_big(sim, round_)
        serve(sim, how, holder, round_)
        die(sim, holder, round_, out_of_memory=True)
        if round_ < 2:
            assert not failures(sim) and sim.state.tasks["big"].state == QUEUED  # computed again
            assert len(sim.state.serving_deaths["big"]) == round_ + 1
    failed = failures(sim)
    assert failed["big"].kind == "memory"
    text = failed["big"].message
    assert text.startswith("out of memory: the result of 'big' (200.0 MiB) is too large")
    assert "a 300.0 MiB memory limit" in text and "the 3 workers holding it died" in text
    assert "h0 (pid 100: was killed by its supervisor" in text and "h2 (pid 102" in text
    assert "--memory-limit" in text and "smaller pieces" in text
    if how == "dependent elsewhere":
        assert failed["use"].kind == "memory"  # its dependents fail with it
    assert sim.state.tasks["big"].state == ERRED and not sim.state.serving_deaths


def test_a_healthy_holder_killed_while_serving_only_costs_a_recomputation(
    sim: SimulatedCluster,
) -> None:
    sim.submit("big", resources="MEM=1")
    for round_ in range(5):
        holder = compute_big(sim, round_)
        serve(sim, "direct gather", holder, round_)
        die(sim, holder, round_, out_of_memory=False)
        assert sim.state.tasks["big"].state == QUEUED
    assert not failures(sim) and not sim.state.serving_deaths and not sim.state.unclassified
    assert len(got(sim, KeysPending)) == 5


def test_a_holder_not_serving_the_result_does_not_count_against_it(
    sim: SimulatedCluster,
) -> None:
    sim.submit("big", resources="MEM=1")
    for round_ in range(4):
        holder = compute_big(sim, round_)
        die(sim, holder, round_, out_of_memory=True)  # out of memory, but for another reason
    assert not failures(sim) and not sim.state.serving_deaths


def test_a_death_near_the_limit_counts_at_once_without_a_supervisor(
    sim: SimulatedCluster,
) -> None:
    sim.submit("big")
    for round_ in range(3):
        holder = sim.add_worker(f"u{round_}", memory_limit=LIMIT)
        sim.place()
        sim.finish("big", nbytes=BIG)
        sim.client_says("c1", GatherRequest(round_, ["big"]))
        sim.worker_says(holder, Heartbeat(0, 280 * MiB))  # 93% of its limit
        sim.remove_worker(holder)
    text = failures(sim)["big"].message
    assert "u0 (pid 0: its memory at 93% of its limit - likely out of memory)" in text


def test_a_serving_death_waits_for_the_report_and_is_not_counted_without_one(
    sim: SimulatedCluster,
) -> None:
    sim.submit("big", resources="MEM=1")
    holder = compute_big(sim, 0)
    serve(sim, "relayed gather", holder, 0)
    sim.remove_worker(holder)
    assert ("h0", 100) in sim.state.unclassified and not sim.state.serving_deaths
    sim.now = 3.5
    sim.handle(Tick(sim.now))
    assert not sim.state.unclassified  # no word in time: nothing says memory
    report = WorkerDied("h0", 100, "was killed by SIGKILL - likely out of memory", 1)
    sim.handle(WorkerDeathReport(report, sim.now))
    assert not sim.state.serving_deaths


def test_a_report_that_comes_first_decides_at_once(sim: SimulatedCluster) -> None:
    sim.submit("big", resources="MEM=1")
    holder = compute_big(sim, 0)
    serve(sim, "relayed gather", holder, 0)
    report = WorkerDied("h0", 100, "was killed by SIGKILL - likely out of memory", 1)
    sim.handle(WorkerDeathReport(report, sim.now))  # the supervisor was quicker
    sim.remove_worker(holder)
    assert [d.worker for d in sim.state.serving_deaths["big"]] == ["h0"]
    assert not sim.state.unclassified


def test_a_late_verdict_fails_a_result_computed_again_meanwhile(sim: SimulatedCluster) -> None:
    sim.submit("big", resources="MEM=1")
    for round_ in range(2):
        die(sim, serve_from(sim, round_), round_, out_of_memory=True)
    holder = serve_from(sim, 2)
    sim.remove_worker(holder)  # the third death; its report comes later
    again = compute_big(sim, 3)
    report = WorkerDied("h2", 102, "was killed by SIGKILL - likely out of memory", 1)
    sim.handle(WorkerDeathReport(report, sim.now))
    assert failures(sim)["big"].kind == "memory"
    assert sim.state.tasks["big"].state == ERRED
    assert not sim.state.workers[again].has_what  # its copy is dropped
    freed = [k for x in sim.to_workers[again] if isinstance(x, FreeKeys) for k in x.keys]
    assert "big" in freed


def test_a_direct_gather_mark_ends_when_the_result_leaves_memory(sim: SimulatedCluster) -> None:
    w = sim.add_worker("w", memory_limit=LIMIT)
    sim.submit("big")
    sim.place()
    sim.finish("big", nbytes=BIG)
    sim.client_says("c1", GatherRequest(1, ["big"], direct_from=MiB))
    assert sim.state.served_directly == {"big"}
    sim.client_says("c1", GatherRequest(2, ["big"], direct_from=BIG + 1))  # relayed: no mark
    sim.client_says("c1", ReleaseKeys(["big"]))
    assert not sim.state.served_directly and "big" not in sim.state.tasks
    assert sim.state.workers[w].has_what == set()


# --- a running task whose workers die out of memory ----------------------------------


@pytest.mark.parametrize("all_of_memory", [True, False])
def test_a_poison_task_whose_workers_all_ran_out_of_memory_says_what_to_do(
    sim: SimulatedCluster, all_of_memory: bool
) -> None:
    sim.submit("hog")
    for i in range(3):
        w = sim.add_worker(f"r{i}", memory_limit=LIMIT, supervisor=42, pid=200 + i)
        sim.place()
        sim.remove_worker(w)
        memory = all_of_memory or i != 1
        how = (
            "was killed by its supervisor: ... - out of memory"
            if memory
            else "exited with status 1"
        )
        sim.handle(WorkerDeathReport(WorkerDied(f"r{i}", 200 + i, how, int(memory)), sim.now))
    failed = failures(sim)["hog"]
    assert failed.kind == "crashed"  # still Dask's KilledWorker: the task ran when they died
    assert "'hog' was running on 3 workers that died" in failed.message
    assert ("Each of them ran out of memory" in failed.message) == all_of_memory
    assert ("--memory-limit" in failed.message) == all_of_memory
