"""The scheduler's state machine, driven through ``RecordingCluster``: no sockets, no clock.

Every test ends with ``check_invariants`` and ``check_all_taken`` (the ``sim``
fixture does both at teardown): a message the test did not take or allow fails it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import TypeVar

import pytest

from apportion.core.resources import ResourceSpec, parse_demand
from apportion.protocol.base import Message
from apportion.protocol.cluster import (
    ClusterFactsReply,
    ClusterFactsRequest,
    InfoReply,
    InfoRequest,
    StoryReply,
    StoryRequest,
    WhyReply,
    WhyRequest,
)
from apportion.protocol.peer_data import DataReply, DataStored, GetData, PutData
from apportion.protocol.services import Unserved
from apportion.protocol.tasks import (
    CancelKeys,
    GatherReply,
    GatherRequest,
    KeysFailed,
    KeysPending,
    Notice,
    ReleaseKeys,
    ScatterReply,
    ScatterRequest,
    SubmitTasks,
    TaskErred,
    TaskSpec,
    WhoHasReply,
    WhoHasRequest,
)
from apportion.protocol.worker import (
    ComputeTask,
    CopiesKept,
    DropPrefetch,
    FreeKeys,
    MissingDependency,
    Prefetch,
    TaskFinished,
    TasksDropped,
    WorkerClosing,
)
from apportion.scheduler import views
from apportion.scheduler.events import FromWorker, PipeEnded
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import (
    ERRED,
    FORGOTTEN,
    MEMORY,
    PROCESSING,
    QUEUED,
    RELEASED,
    WAITING,
)
from apportion.scheduler.relay import PIPE_FROM
from apportion.scheduler.state import PREFETCH_FROM, SchedulerConfig
from apportion.scheduler.unsatisfiable import check_demand
from apportion.testing import Interval, RecordingCluster, UnexpectedMessages

M = TypeVar("M", bound=Message)


def peak(intervals: list[Interval], keys: set[str], worker: str | None = None) -> int:
    """Most of ``keys`` running at once (on ``worker``, if given)."""
    edges: list[tuple[float, int]] = []
    for iv in intervals:
        if iv.key in keys and (worker is None or iv.worker == worker):
            edges += [(iv.start, 1), (iv.end, -1)]
    running = best = 0
    for _, delta in sorted(edges):  # ends (-1) sort before starts at the same time
        running += delta
        best = max(best, running)
    return best


def by_key(intervals: list[Interval]) -> dict[str, Interval]:
    return {iv.key: iv for iv in intervals}


# --- placement only where resources are free ------------------------------------------


def test_tasks_start_only_where_their_demand_is_free(sim: RecordingCluster) -> None:
    small = sim.add_worker("small", nthreads=4, resources="GPU=1")
    big = sim.add_worker("big", nthreads=4, resources="GPU=2")
    plain = sim.add_worker("plain", nthreads=4)
    for i in range(4):
        sim.submit(f"g{i}", resources="GPU=1")
    started = sim.place()
    assert len(started) == 3
    assert sorted(w for w, _ in started) == sorted([small, big, big])
    assert sim.state_of("g3") == QUEUED
    assert sim.free(small) == {"GPU": 0} and sim.free(big) == {"GPU": 0}
    assert not sim.running[plain]
    sim.finish("g0")
    assert sim.place() == [(sim.worker_of("g3"), "g3")]
    assert sorted(sim.done()) == ["g0"]  # each reported once


def test_fractional_demands_share_one_unit(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=8, resources="GPU=1")
    for i in range(3):
        sim.submit(f"h{i}", resources="GPU=0.5")
    assert len(sim.place()) == 2
    assert sim.state_of("h2") == QUEUED
    sim.finish("h0")
    sim.place()
    sim.finish("h1")
    sim.finish("h2")
    assert sim.free(w) == {"GPU": 1.0}
    assert sorted(sim.done()) == ["h0", "h1", "h2"]  # each reported once


def test_resource_tasks_are_not_pipelined_beyond_threads(sim: RecordingCluster) -> None:
    sim.add_worker(nthreads=2, resources="lic=10")
    for i in range(5):
        sim.submit(f"l{i}", resources="lic=1")
    assert len(sim.place()) == 2


def test_plain_tasks_are_pipelined_a_little(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=2)
    sim.measured("p-0", 0.001)
    for i in range(20):
        sim.submit(f"p-{i}")
    started = sim.place()
    # 1 ms each: 2 ms of work (two tasks) queued behind each thread's running task.
    assert len(started) == 6
    assert len(sim.running[w]) == 6


def test_long_or_unknown_plain_tasks_are_never_queued_ahead(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=2)
    sim.measured("long-0", 0.2)  # past queue_ahead_below
    for i in range(5):
        sim.submit(f"long-{i}")
        sim.submit(f"new-{i}")  # a group nobody has measured: unknown_duration
    assert sim.place() == [(w, "long-0"), (w, "new-0")]  # a thread each, none queued
    sim.finish("new-0")
    assert sim.state.telemetry.tally("new-1").expected == 0.001  # measured now: short
    # A free thread for the oldest; then the short one may wait behind a running task,
    # and the next long one may not: it waits in the scheduler for a thread.
    assert sim.place() == [(w, "long-1"), (w, "new-1")]
    sim.finish("long-0", duration=0.2)
    assert sim.place() == []  # new-1 takes the thread long-0 frees
    sim.finish("new-1")
    assert sim.place() == [(w, "long-2"), (w, "new-2")]
    assert sorted(sim.done()) == ["long-0", "new-0", "new-1"]
    check_invariants(sim.state)


def test_no_plain_task_is_queued_ahead_of_waiting_gpu_work(sim: RecordingCluster) -> None:
    gpu = sim.add_worker("gpu", nthreads=2, resources="GPU=2")
    cpu = sim.add_worker("cpu", nthreads=1)
    sim.measured("p-0", 0.001)
    for i in range(3):
        sim.submit(f"g{i}", resources="GPU=1")
    for i in range(10):
        sim.submit(f"p-{i}")
    sim.place()
    # g0 and g1 hold both threads of the GPU worker; g2 waits for one of them, so no
    # plain task may sit there ahead of it. The CPU worker still pipelines: 1 ms
    # tasks, two queued behind the one running.
    assert sorted(sim.running[gpu]) == ["g0", "g1"]
    assert len(sim.running[cpu]) == 3
    sim.finish("g0")
    sim.place()
    assert "g2" in sim.running[gpu]
    sim.finish("g1")
    sim.finish("g2")
    sim.place()  # no GPU work left: the GPU worker takes plain tasks, queued ahead too
    assert len(sim.running[gpu]) == 6
    assert sorted(sim.done()) == ["g0", "g1", "g2"]  # each reported once


def test_two_gpu_task_never_shares_a_two_gpu_worker(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=4, resources="GPU=2")
    keys = ["a", "b", "big", "c", "d", "big2", "e"]
    for key in keys:
        sim.submit(key, resources="GPU=2" if key.startswith("big") else "GPU=1")
    intervals = sim.run({k: 1.0 + 0.1 * i for i, k in enumerate(keys)})
    assert {iv.key for iv in intervals} == set(keys)
    spans = by_key(intervals)
    for big in ("big", "big2"):
        for other in keys:
            if other != big:
                iv, ov = spans[big], spans[other]
                assert iv.end <= ov.start or ov.end <= iv.start, f"{big} overlaps {other}"
    assert peak(intervals, set(keys), w) <= 2
    assert sim.free(w) == {"GPU": 2.0}
    assert sorted(sim.done()) == ["a", "b", "big", "big2", "c", "d", "e"]  # each reported once


# --- no head-of-line blocking ---------------------------------------------------------


def test_blocked_large_request_does_not_block_others_elsewhere(sim: RecordingCluster) -> None:
    w_big = sim.add_worker("gpu2", nthreads=4, resources="GPU=2 MEM=4")
    sim.submit("running", resources="GPU=1")
    assert sim.place() == [(w_big, "running")]
    w_one = sim.add_worker("gpu1", nthreads=4, resources="GPU=1")
    sim.submit("big", resources="GPU=2")  # fits nowhere now: holds gpu2's free GPU
    sim.submit("small", resources="GPU=1")  # younger, fits on gpu1
    sim.submit("mem", resources="MEM=1")  # younger, other resource on the busy worker
    started = {k: w for w, k in sim.place()}
    assert started == {"small": w_one, "mem": w_big}
    assert sim.state_of("big") == QUEUED
    assert sim.state.tasks["big"].reserved_on == w_big


def test_dask_6136_gpu2_queued_does_not_block_gpu1_on_another_worker(
    sim: RecordingCluster,
) -> None:
    a = sim.add_worker("a", nthreads=2, resources="GPU=2")
    b = sim.add_worker("b", nthreads=2, resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.submit("y", resources="GPU=1")
    sim.place()  # x and y hold one GPU on each worker (least loaded first)
    assert {sim.worker_of("x"), sim.worker_of("y")} == {a, b}
    sim.submit("wide", resources="GPU=2")
    sim.place()
    (on_b,) = sim.running[b]
    sim.finish(on_b)
    sim.submit("z", resources="GPU=1")
    assert sim.place() == [(b, "z")]
    assert sim.state_of("wide") == QUEUED
    assert sorted(sim.done()) == ["y"]  # each reported once


# --- no starvation --------------------------------------------------------------------


def _stream(sim: RecordingCluster, resources: ResourceSpec) -> Callable[[], str]:
    """A source of new small tasks: each call submits one more."""
    count = itertools.count()

    def submit_one() -> str:
        key = f"s-{next(count)}"
        sim.submit(key, resources=resources)
        return key

    return submit_one


def test_stream_of_small_requests_cannot_starve_a_whole_worker_request(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker("gpu", nthreads=4, resources="GPU=2")
    small = _stream(sim, "GPU=1")
    small(), small()
    sim.place()
    running_at_submission = set(sim.running[w])
    assert running_at_submission == {"s-0", "s-1"}
    sim.submit("big", resources="GPU=2")
    assert sim.place() == []
    # A steady stream: every time a small task finishes, a new one arrives at once.
    after: list[str] = []
    while "big" not in sim.running[w]:
        assert len(after) < 10, "the GPU=2 task is starved by the GPU=1 stream"
        sim.now += 1.0
        sim.finish(min(k for k in sim.running[w]))
        after.append(small())
        sim.place()
    # It started as soon as the GPU=1 tasks running at its submission finished ...
    assert not running_at_submission & sim.all_running()
    assert len(after) == len(running_at_submission)
    # ... and before any GPU=1 task submitted after it.
    started = [key for _, _, key in sim.started]
    assert started[: started.index("big")] == ["s-0", "s-1"]
    assert not set(after) & set(started)
    sim.finish("big")
    assert sorted(k for _, k in sim.place()) == after
    assert sorted(sim.done()) == ["big", "s-0", "s-1"]  # each reported once


def test_stream_of_plain_tasks_cannot_starve_a_resource_task(sim: RecordingCluster) -> None:
    """Plain tasks pipelined ahead keep threads busy; the reservation lets them drain."""
    w = sim.add_worker("w", nthreads=2, resources="GPU=1")
    sim.measured("s-0", 0.001)
    plain = _stream(sim, None)
    for _ in range(4):
        plain()
    sim.place()
    assigned_before = set(sim.running[w])
    sim.submit("gpu", resources="GPU=1")
    sim.place()
    after: list[str] = []
    while "gpu" not in sim.running[w]:
        assert len(after) < 20, "the GPU task is starved by the plain stream"
        sim.finish(min(sim.running[w]))
        after.append(plain())
        sim.place()
    started = [key for _, _, key in sim.started]
    assert set(started[: started.index("gpu")]) == assigned_before
    assert not set(after) & set(started[: started.index("gpu")])
    assert sorted(sim.done()) == ["s-0", "s-1", "s-2"]  # each reported once


def test_reservation_holds_one_worker_while_the_other_keeps_working(
    sim: RecordingCluster,
) -> None:
    """The worker closest to fitting is held; the other keeps taking small tasks."""
    w1 = sim.add_worker("w1", nthreads=4, resources="GPU=2")
    w2 = sim.add_worker("w2", nthreads=4, resources="GPU=2")
    for key in ("a", "b", "c"):
        sim.submit(key, resources="GPU=1")
    sim.place()
    sim.submit("big", resources="GPU=2")
    sim.place()
    reserved = sim.state.tasks["big"].reserved_on
    assert reserved is not None
    assert len(sim.running[reserved]) == 1  # closest to fitting: one GPU already free
    other = w2 if reserved == w1 else w1
    sim.submit("d", resources="GPU=1")
    assert sim.place() == []  # the free GPU on the reserved worker is held
    sim.finish(sorted(sim.running[other])[0])
    assert sim.place() == [(other, "d")]
    sim.finish(next(iter(sim.running[reserved])))
    sim.submit("e", resources="GPU=1")
    assert sim.place() == [(reserved, "big")]
    assert sim.state.tasks["big"].reserved_on is None
    assert sim.state_of("e") == QUEUED  # and now the oldest blocked GPU=1 task
    assert sim.state.workers[reserved].reserved_by == "e"
    assert sorted(sim.done()) == ["a", "b"]  # each reported once


def test_reserved_task_waiting_only_for_a_thread_drains_plain_tasks(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.measured("p-0", 0.001)
    for i in range(2):
        sim.submit(f"p-{i}")
    sim.place()  # one running, one queued ahead
    sim.submit("gpu", resources="GPU=1")
    for i in range(2, 6):
        sim.submit(f"p-{i}")
    sim.place()
    assert sim.state.workers[w].reserved_by == "gpu"
    sim.finish("p-0")
    assert sim.place() == []  # p-1 is already there; no more plain work piles on
    sim.finish("p-1")
    started = sim.place()
    assert started[0] == (w, "gpu")  # plain tasks may queue behind it, not before it
    assert sorted(sim.done()) == ["p-0", "p-1"]  # each reported once


# --- Guild's run queue ----------------------------------------------------------------


GUILD = {"aaa": "gpu0=1", "bbb": "gpu0=1", "ccc": "gpu0=1 gpu1=1", "ddd": "gpu1=1"}


@pytest.mark.parametrize("order", [["aaa", "bbb", "ccc", "ddd"], ["aaa", "ddd", "bbb", "ccc"]])
def test_guild_runs_take_three_lengths(sim: RecordingCluster, order: list[str]) -> None:
    sim.add_worker("guild", nthreads=4, resources="gpu0=1 gpu1=1")
    for key in order:
        sim.submit(key, resources=GUILD[key])
    spans = by_key(sim.run(dict.fromkeys(GUILD, 2.0)))
    assert spans["aaa"].start == spans["ddd"].start == 0.0
    assert spans["bbb"].start == 2.0
    assert spans["ccc"].start == 4.0
    assert max(iv.end for iv in spans.values()) == 6.0
    assert sorted(sim.done()) == sorted(GUILD)


# --- the seed example -----------------------------------------------------------------


def test_seed_example_two_gpu_workers_and_a_memory_worker(sim: RecordingCluster) -> None:
    gpu_workers = [sim.add_worker(f"gpu{i}", nthreads=4, resources="GPU=2") for i in range(2)]
    mem_worker = sim.add_worker("bigmem", nthreads=4, resources="MEMORY=100e9")
    graph: dict[str, tuple[list[str], ResourceSpec]] = {}
    for i in range(12):
        graph[f"load-{i}"] = ([], None)
        graph[f"process-{i}"] = ([f"load-{i}"], {"GPU": 1})
    graph["aggregate"] = ([f"process-{i}" for i in range(12)], {"MEMORY": 70e9})
    sim.submit_graph(graph, wanted=list(graph))
    durations = {k: (1.0 if k.startswith("process") else 0.5) for k in graph}
    intervals = sim.run(durations)
    spans = by_key(intervals)
    assert set(spans) == set(graph)
    assert spans["aggregate"].worker == mem_worker
    processes = {k for k in graph if k.startswith("process")}
    assert {spans[k].worker for k in processes} <= set(gpu_workers)
    for w in gpu_workers:
        assert peak(intervals, processes, w) <= 2
    assert peak(intervals, processes) == 4  # both GPU workers kept busy
    assert spans["aggregate"].start >= max(spans[k].end for k in processes)
    assert sorted(sim.done()) == sorted(graph)


# --- priority -------------------------------------------------------------------------


def test_higher_priority_starts_first_then_submission_order(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("first", resources="GPU=1")
    sim.place()
    sim.submit("low1", resources="GPU=1")
    sim.submit("low2", resources="GPU=1")
    sim.submit("high", resources="GPU=1", priority=10)
    sim.submit("mid", resources="GPU=1", priority=5)
    assert sim.place() == []
    sim.finish("first")
    spans = sim.run({})
    assert [iv.key for iv in sorted(spans, key=lambda iv: iv.start)] == [
        "high",
        "mid",
        "low1",
        "low2",
    ]
    assert sim.free(w) == {"GPU": 1.0}
    assert sorted(sim.done()) == ["first", "high", "low1", "low2", "mid"]  # each reported once


def test_priority_across_request_kinds(sim: RecordingCluster) -> None:
    sim.add_worker(nthreads=1, resources="GPU=1 lic=1")
    sim.submit("old", resources="lic=1")
    sim.submit("urgent", resources="GPU=1", priority=1)
    assert sim.place()[0][1] == "urgent"


def test_plain_tasks_follow_priority(sim: RecordingCluster) -> None:
    sim.submit("a")
    sim.submit("b")
    sim.submit("c", priority=3)
    w = sim.add_worker(nthreads=2)
    assert sim.place() == [(w, "c"), (w, "a")]


# --- dependencies and releasing results ---------------------------------------------


def test_chain_runs_in_order_and_releases_intermediates(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=2)
    sim.submit_graph({"a": ([], None), "b": (["a"], None), "c": (["b"], None)}, wanted=["c"])
    assert (sim.state_of("a"), sim.state_of("b"), sim.state_of("c")) == (QUEUED, WAITING, WAITING)
    assert sim.place() == [(w, "a")]
    sim.finish("a")
    assert sim.state_of("b") == QUEUED
    assert sim.state_of("c") == WAITING
    assert sim.place() == [(w, "b")]
    compute_b = sim.worker_got(w, ComputeTask)[-1]
    assert compute_b.who_has == {"a": [f"sim://{w}"]}
    assert "a" not in sim.freed(w)
    sim.finish("b")
    assert "a" in sim.freed(w)  # its only dependent finished and nobody wants it
    assert sim.state_of("a") == RELEASED  # its data is gone; its recipe stays for b's sake
    sim.place()
    sim.finish("c")
    assert sim.freed(w) == ["a", "b"]
    assert sim.done() == ["c"]
    assert {k: t.state for k, t in sim.state.tasks.items()} == {
        "a": RELEASED,
        "b": RELEASED,
        "c": MEMORY,
    }
    sim.client_says("c1", ReleaseKeys(["c"]))  # the whole lineage goes with it
    assert sim.freed(w) == ["a", "b", "c"]
    assert sim.state.tasks == {}
    assert sim.state.functions == {}
    assert sim.state.workers[w].has_what == set()


def test_diamond_keeps_shared_input_until_both_dependents_finish(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=4, resources="GPU=1")
    sim.submit_graph(
        {
            "a": ([], None),
            "b": (["a"], "GPU=1"),
            "c": (["a"], None),
            "d": (["b", "c"], None),
        },
        wanted=["d"],
    )
    sim.place()
    sim.finish("a")
    assert sorted(k for _, k in sim.place()) == ["b", "c"]
    sim.finish("c")
    assert sim.state_of("a") == MEMORY  # b still needs it
    assert sim.state_of("d") == WAITING
    sim.finish("b")
    assert sim.state_of("a") == RELEASED  # data dropped; kept as b's and c's lineage
    assert sim.state_of("d") == QUEUED
    sim.place()
    sim.finish("d")
    assert sorted(sim.freed(w)) == ["a", "b", "c"]
    sim.client_says("c1", ReleaseKeys(["d"]))
    assert sim.state.tasks == {}
    assert sim.done() == ["d"]
    assert sorted(sim.freed(w)) == ["a", "b", "c", "d"]


def test_result_wanted_by_a_client_is_kept_after_dependents_finish(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker(nthreads=2)
    sim.submit_graph({"a": ([], None), "b": (["a"], None)}, wanted=["a", "b"])
    sim.run({})
    assert sorted(sim.done()) == ["a", "b"]
    assert sim.freed(w) == []
    sim.client_says("c1", ReleaseKeys(["a"]))
    assert sim.freed(w) == ["a"]
    assert set(sim.state.tasks) == {"a", "b"} and sim.state_of("a") == RELEASED


def test_two_clients_share_a_result_until_both_release(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.add_client("c2")
    sim.submit("x")
    sim.submit("x", client="c2")
    sim.run({})
    assert sim.done("c1") == ["x"] and sim.done("c2") == ["x"]
    sim.client_says("c1", ReleaseKeys(["x"]))
    assert sim.state_of("x") == MEMORY
    sim.remove_client("c2")
    assert sim.state.tasks == {}
    assert sorted(sim.freed("w1")) == ["x"]


def test_dependent_on_finished_result_is_queued_at_once(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.submit("a")
    sim.run({})
    sim.submit("b", deps=["a"])
    assert sim.state_of("b") == QUEUED
    assert sorted(sim.done()) == ["a"]  # each reported once


def test_dependent_on_unknown_key_fails_as_lost(sim: RecordingCluster) -> None:
    sim.submit("b", deps=["nope"])
    (failed,) = sim.got(KeysFailed)
    assert failed.keys == ["b"] and failed.kind == "lost" and "'nope'" in failed.message


def test_release_of_a_queued_task_forgets_it(sim: RecordingCluster) -> None:
    sim.submit("x", resources="GPU=1")
    sim.client_says("c1", ReleaseKeys(["x"]))
    assert sim.state.tasks == {}
    assert sim.state.story("x")[-1][2:4] == (QUEUED, FORGOTTEN)
    w = sim.add_worker(resources="GPU=1")
    assert sim.place() == []
    assert not sim.running[w]


def test_release_of_a_running_task_frees_resources_on_report(sim: RecordingCluster) -> None:
    w = sim.add_worker(resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.place()
    sim.client_says("c1", ReleaseKeys(["x"]))
    assert sim.freed(w) == ["x"]
    assert sim.state_of("x") == PROCESSING
    assert sim.free(w) == {"GPU": 0.0}
    sim.finish("x")
    assert sim.state.tasks == {}
    assert sim.free(w) == {"GPU": 1.0}
    assert sim.done() == []


def test_released_running_task_leaves_processing_at_once_but_keeps_its_thread(
    sim: RecordingCluster,
) -> None:
    # Dask's test_get_stops_work_after_error: the get's futures are released on its
    # error, and processing() must be empty then, though the thread still runs.
    w = sim.add_worker(nthreads=1, resources="GPU=1")
    sim.submit("y", resources="GPU=1")
    sim.submit("z")
    assert sim.place() == [(w, "y")]
    sim.client_says("c1", ReleaseKeys(["y"]))
    assert sim.freed(w) == ["y"]
    sim.client_says("c1", ClusterFactsRequest(1))
    (facts,) = sim.got(ClusterFactsReply)
    assert facts.processing == {f"sim://{w}": []}
    assert views.snapshot(sim.state)["workers"][f"sim://{w}"]["processing"] == 0
    assert "released while running" in sim.state.story("y")[-1][4]
    # Its thread and its GPU are still taken until the worker says it ended: nothing
    # else is given that thread, and the ledger gives the GPU back exactly once.
    assert sim.place() == []
    assert sim.free(w) == {"GPU": 0.0}
    check_invariants(sim.state)
    sim.finish("y")
    assert sim.free(w) == {"GPU": 1.0}
    assert sim.place() == [(w, "z")]
    sim.client_says("c1", ClusterFactsRequest(2))
    facts = sim.got(ClusterFactsReply)[-1]
    assert facts.processing == {f"sim://{w}": ["z"]}
    check_invariants(sim.state)


def test_release_waiting_chain_forgets_all(sim: RecordingCluster) -> None:
    sim.submit_graph({"a": ([], None), "b": (["a"], None)}, wanted=["b"])
    sim.client_says("c1", ReleaseKeys(["b"]))
    assert sim.state.tasks == {}


# --- failures -------------------------------------------------------------------------


def test_raised_task_errs_for_client_and_its_dependents(sim: RecordingCluster) -> None:
    sim.add_worker(nthreads=2)
    sim.submit_graph({"a": ([], None), "b": (["a"], None), "c": (["b"], None)}, wanted=["a", "c"])
    sim.place()
    sim.raise_("a", exception=b"boom", traceback=b"tb")
    erred = sim.got(TaskErred)
    assert sorted(e.key for e in erred) == ["a", "c"]
    assert all(e.exception == b"boom" and e.traceback == b"tb" for e in erred)
    assert sim.state_of("a") == sim.state_of("c") == ERRED
    # Nobody wants it, but it is kept, failed, while "c" may be retried through it.
    assert sim.state_of("b") == ERRED and not sim.state.tasks["b"].needed()
    assert sim.place() == []
    sim.client_says("c1", ReleaseKeys(["a", "c"]))
    assert sim.state.tasks == {}


def test_submitting_onto_an_erred_input_fails_at_once(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.submit("a")
    sim.place()
    sim.raise_("a", exception=b"boom")
    sim.submit("b", deps=["a"])
    assert [e.key for e in sim.got(TaskErred)] == ["a", "b"]
    assert sim.state_of("b") == ERRED


def test_retries_requeue_then_fail(sim: RecordingCluster) -> None:
    w = sim.add_worker(resources="GPU=1")
    sim.submit("x", resources="GPU=1", retries=2)
    for _ in range(2):
        assert sim.place() == [(w, "x")]
        sim.raise_("x")
        assert sim.state_of("x") == QUEUED
        assert sim.got(TaskErred) == []
        assert sim.free(w) == {"GPU": 1.0}
    assert sim.place() == [(w, "x")]
    sim.raise_("x")
    assert sim.state_of("x") == ERRED
    assert [e.key for e in sim.got(TaskErred)] == ["x"]
    assert sim.place() == []
    causes = [row[4] for row in sim.state.story("x")]
    assert sum("retrying" in c for c in causes) == 2


def test_cancel_queued_task(sim: RecordingCluster) -> None:
    sim.submit_graph({"a": ([], "GPU=1"), "b": (["a"], None)}, wanted=["a", "b"])
    sim.client_says("c1", CancelKeys(["a"]))
    failed = sim.got(KeysFailed)
    assert sorted(k for f in failed for k in f.keys) == ["a", "b"]
    assert {f.kind for f in failed} == {"cancelled"}
    assert sim.state_of("a") == ERRED
    w = sim.add_worker(resources="GPU=1")
    assert sim.place() == []
    assert not sim.running[w]


def test_cancel_running_task_returns_resources_only_on_report(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.submit("y", resources="GPU=1")
    sim.place()
    sim.client_says("c1", CancelKeys(["x"]))
    (failed,) = sim.got(KeysFailed)
    assert failed.keys == ["x"] and failed.kind == "cancelled"
    assert sim.freed(w) == ["x"]  # the worker is told to stop / drop it
    assert sim.free(w) == {"GPU": 0.0}
    check_invariants(sim.state)
    assert sim.place() == []  # y cannot use the GPU x still holds
    sim.finish("x")  # the worker reports; the result is discarded
    assert sim.free(w) == {"GPU": 1.0}
    assert sim.state_of("x") == ERRED
    assert sim.done() == []
    assert sim.place() == [(w, "y")]
    sim.client_says("c1", ReleaseKeys(["x"]))
    assert "x" not in sim.state.tasks


def test_task_dropped_before_it_started_returns_its_resources(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=2, resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.submit("y", resources="GPU=1")
    sim.place()
    sim.client_says("c1", CancelKeys(["x"]))
    assert sim.freed(w) == ["x"]
    # The worker had not started x: it drops it and says so instead of reporting a run.
    del sim.running[w]["x"]
    sim.handle(FromWorker(w, [TasksDropped(["x"])], sim.now))
    assert sim.free(w) == {"GPU": 1.0}
    assert sim.state_of("x") == ERRED
    assert sim.place() == [(w, "y")]
    (failed,) = sim.got(KeysFailed)  # told at the cancel; the drop adds nothing
    assert failed.keys == ["x"] and failed.kind == "cancelled"


def test_closing_worker_is_logged_as_a_departure_not_a_loss(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("leaver")
    w2 = sim.add_worker("crasher")
    sim.handle(FromWorker(w1, [WorkerClosing("SIGTERM")], sim.now))
    sim.remove_worker(w1)
    sim.remove_worker(w2)
    texts = [
        (log.level, log.text) for log in sim.logs if "leaver" in log.text or "crasher" in log.text
    ]
    assert ("info", "worker leaver closed (SIGTERM)") in texts
    assert any(level == "warning" and "lost worker crasher" in text for level, text in texts)


def test_cancel_finished_task_is_a_no_op(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.submit("x")
    sim.run({})
    sim.client_says("c1", CancelKeys(["x", "unknown"]))
    assert sim.state_of("x") == MEMORY
    assert sim.got(KeysFailed) == []
    assert sorted(sim.done()) == ["x"]  # each reported once


# --- worker loss ----------------------------------------------------------------------


def test_lost_worker_running_tasks_finish_elsewhere(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("w1", resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    assert sim.place() == [(w1, "x")]
    w2 = sim.add_worker("w2", resources="GPU=1")
    assert sim.remove_worker(w1) == ["x"]
    assert sim.state_of("x") == QUEUED
    assert any("w1" in log.text and log.level == "warning" for log in sim.logs)
    assert sim.place() == [(w2, "x")]
    sim.finish("x")
    assert sim.done() == ["x"]
    assert sim.free(w2) == {"GPU": 1.0}


def test_lost_results_are_recomputed_when_needed(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("w1", nthreads=2)
    sim.submit_graph({"a": ([], None), "b": (["a"], "GPU=1")}, wanted=["b"])
    (notice,) = sim.got(Notice)  # no GPU worker yet: the client is warned about b
    assert "no worker offers GPU" in notice.text
    sim.place()
    sim.finish("a")
    assert sim.state_of("b") == QUEUED  # no GPU worker yet
    sim.remove_worker(w1)
    assert sim.state_of("a") == QUEUED
    assert sim.state_of("b") == WAITING
    w2 = sim.add_worker("w2", nthreads=2, resources="GPU=1")
    spans = by_key(sim.run({}))
    assert spans["a"].worker == w2 and spans["b"].worker == w2
    assert sim.done() == ["b"]
    assert sim.freed(w2) == ["a"]  # once b, its only dependent, finished
    assert sim.free(w2) == {"GPU": 1.0}


def test_lost_result_whose_input_was_released_is_recomputed_from_its_lineage(
    sim: RecordingCluster,
) -> None:
    w1 = sim.add_worker("w1")
    sim.submit_graph({"a": ([], None), "b": (["a"], None)}, wanted=["a", "b"])
    sim.run({})
    sim.client_says("c1", ReleaseKeys(["a"]))
    assert sim.state_of("a") == RELEASED  # nobody wants it; b was computed from it
    assert sim.freed(w1) == ["a"]
    w2 = sim.add_worker("w2")
    sim.remove_worker(w1)
    assert not sim.got(KeysFailed)
    assert sim.got(KeysPending) == [KeysPending(["b"])]  # a is wanted by nobody
    sim.run({})
    assert sim.done() == ["a", "b", "b"] and sim.state_of("b") == MEMORY
    assert sim.state.tasks["b"].worker == w2
    assert sim.freed(w2) == ["a"]  # recomputed for b only, and dropped again


def test_lost_results_chain_is_recomputed_in_order(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("w1")
    sim.submit_graph(
        {"a": ([], None), "b": (["a"], None), "c": (["b"], None)}, wanted=["a", "b", "c"]
    )
    sim.run({})
    assert sim.done() == ["a", "b", "c"]
    sim.remove_worker(w1)
    assert (sim.state_of("a"), sim.state_of("b"), sim.state_of("c")) == (QUEUED, WAITING, WAITING)
    assert sorted(k for p in sim.got(KeysPending) for k in p.keys) == ["a", "b", "c"]
    w2 = sim.add_worker("w2")
    assert [iv.key for iv in sim.run({})] == ["a", "b", "c"]
    assert sorted(sim.state.workers[w2].has_what) == ["a", "b", "c"]
    assert sim.done() == ["a", "b", "c"] * 2  # each reported again once recomputed


def test_lost_worker_with_a_reservation_and_cancelled_running_task(
    sim: RecordingCluster,
) -> None:
    w1 = sim.add_worker("w1", nthreads=2, resources="GPU=2")
    w2 = sim.add_worker("w2", nthreads=2, resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.submit("y", resources="GPU=1")
    sim.place()
    sim.submit("big", resources="GPU=2")
    sim.place()
    assert sim.state.tasks["big"].reserved_on == w1
    running_on_w1 = set(sim.running[w1])
    (victim,) = running_on_w1
    (survivor,) = {"x", "y"} - running_on_w1
    sim.client_says("c1", CancelKeys([victim]))
    assert sim.freed(w1) == [victim]
    sim.remove_worker(w1)
    assert sim.state.tasks["big"].reserved_on is None
    assert sim.state_of(victim) == ERRED
    (failed,) = sim.got(KeysFailed)  # at the cancel; the loss settles it silently
    assert failed.keys == [victim] and failed.kind == "cancelled"
    check_invariants(sim.state)
    w3 = sim.add_worker("w3", nthreads=2, resources="GPU=2")
    for key in list(sim.running[w2]):
        sim.finish(key)
    spans = by_key(sim.run({}))
    assert spans["big"].worker == w3
    assert sim.free(w2) == {"GPU": 1.0} and sim.free(w3) == {"GPU": 2.0}
    assert sim.done() == [survivor, "big"]


def test_stale_reports_from_a_lost_worker_are_ignored(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("w1", resources="GPU=1")
    w2 = sim.add_worker("w2", resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.place()
    first = sim.worker_of("x")
    other = w2 if first == w1 else w1
    sim.remove_worker(first)
    sim.place()
    # A late report from a worker that left changes nothing.
    sim.handle(FromWorker(first, [TaskFinished("x", 8, 0.1, "int")], sim.now))
    assert sim.state_of("x") == PROCESSING
    # A report for a task the worker is not running makes it drop the data.
    sim.handle(FromWorker(other, [TaskFinished("ghost", 8, 0.1, "int")], sim.now))
    assert "ghost" in sim.freed(other)
    sim.finish("x")
    assert sim.done() == ["x"]


# --- requests nobody can meet -------------------------------------------------------


def test_unsatisfiable_request_warns_once_and_stays_queued(sim: RecordingCluster) -> None:
    sim.add_worker("small", resources="GPU=2")
    sim.add_worker("none")
    sim.submit("x", resources="GPU=4")
    sim.submit("y", resources="GPU=4")
    sim.place()
    sim.place()
    warnings = [log.text for log in sim.logs if log.level == "warning"]
    assert len(warnings) == 1
    assert "GPU" in warnings[0] and "largest GPU supply is 2 on small" in warnings[0]
    notices = sim.got(Notice)
    assert len(notices) == 1 and notices[0].level == "warning"
    assert notices[0].text == warnings[0]
    assert sim.state_of("x") == sim.state_of("y") == QUEUED
    assert sim.got(KeysFailed) == []
    # Another kind of request gets its own warning.
    sim.submit("z", resources="lic=1")
    assert "no worker offers lic" in sim.logs[-1].text
    on_lic = Notice("warning", sim.logs[-1].text)
    assert sim.got(Notice) == [*notices, on_lic]
    # A worker that can run it arrives: the task starts.
    big = sim.add_worker("big", resources="GPU=4")
    assert sim.place() == [(big, "x")]
    # The supply changed: z, which big cannot run either, is warned about anew.
    assert sim.got(Notice) == [*notices, on_lic, on_lic]


def test_unsatisfiable_before_any_worker_warns_at_placement(sim: RecordingCluster) -> None:
    sim.submit("x", resources="GPU=4")
    assert sim.logs == []
    sim.add_worker("small", resources="GPU=2")
    sim.place()
    assert [n.text for n in sim.got(Notice)] == [
        log.text for log in sim.logs if log.level == "warning"
    ]
    assert len(sim.got(Notice)) == 1
    assert sim.state_of("x") == QUEUED


def test_unsatisfiable_fails_at_once_on_a_cluster_that_cannot_grow(
    make_sim: Callable[..., RecordingCluster],
) -> None:
    sim = make_sim(SchedulerConfig(fail_unsatisfiable=True))
    sim.add_worker("small", resources="GPU=2")
    sim.submit_graph({"x": ([], "GPU=3"), "y": (["x"], None)}, wanted=["x", "y"])
    failed = sim.got(KeysFailed)
    assert sorted(k for f in failed for k in f.keys) == ["x", "y"]
    assert {f.kind for f in failed} == {"unsatisfiable"}
    assert "largest GPU supply is 2 on small" in failed[0].message
    assert sim.state_of("x") == ERRED
    assert sim.place() == []


def test_fail_unsatisfiable_applies_once_workers_exist(
    make_sim: Callable[..., RecordingCluster],
) -> None:
    sim = make_sim(SchedulerConfig(fail_unsatisfiable=True))
    sim.submit("x", resources="GPU=3")
    assert sim.got(KeysFailed) == []
    sim.add_worker("small", resources="GPU=2")
    sim.place()
    (failed,) = sim.got(KeysFailed)
    assert failed.kind == "unsatisfiable"


def test_worker_loss_can_make_a_request_unsatisfiable(sim: RecordingCluster) -> None:
    big = sim.add_worker("big", resources="GPU=4")
    sim.add_worker("small", resources="GPU=1")
    sim.submit("x", resources="GPU=1")
    sim.submit("y", resources="GPU=4")
    sim.place()
    sim.remove_worker(big)
    sim.place()
    assert any("largest GPU supply is 1 on small" in n.text for n in sim.got(Notice))


@pytest.mark.parametrize("name", ["gpu", "GUP"])
def test_a_misspelt_resource_fails_at_submission_saying_what_was_meant(
    sim: RecordingCluster, name: str
) -> None:
    sim.add_worker("gpus", resources="GPU=2 MEMORY=16GiB")
    sim.submit_graph({"x": ([], f"{name}=1"), "y": (["x"], None)}, wanted=["x", "y"])
    failed = sim.got(KeysFailed)
    assert sorted(k for f in failed for k in f.keys) == ["x", "y"]
    assert {f.kind for f in failed} == {"misnamed"}
    text = failed[0].message
    assert f"task 'x' asks for {name}=1, but no connected worker offers {name}" in text
    assert f"did you mean GPU (not {name})?" in text
    assert "the workers offer GPU=2 on gpus, MEMORY=16 GiB on gpus" in text
    assert sim.state_of("x") == ERRED
    assert sim.got(Notice) == []  # the failure says it all


def test_a_misspelt_resource_fails_once_a_worker_says_what_it_offers(
    sim: RecordingCluster,
) -> None:
    sim.submit("x", resources="gpu=1")
    assert sim.got(KeysFailed) == []  # no worker yet: nobody knows what is offered
    sim.add_worker("gpus", resources="GPU=2")
    sim.place()
    (failed,) = sim.got(KeysFailed)
    assert failed.kind == "misnamed" and "did you mean GPU (not gpu)?" in failed.message


def test_an_unknown_resource_that_is_no_slip_only_warns(sim: RecordingCluster) -> None:
    sim.add_worker("gpus", resources="GPU=2")
    sim.submit("x", resources="licence=1")
    sim.submit("y", resources="gpu1=1")  # another pool, maybe on a worker still to come
    sim.submit("z", resources="cpu=1")  # as likely another pool as a slip: said, no more
    assert sim.got(KeysFailed) == []
    notices = [n.text for n in sim.got(Notice)]
    assert len(notices) == 3
    assert "no worker offers cpu (did you mean GPU (not cpu)?)" in notices[2]
    assert sim.state_of("x") == sim.state_of("y") == sim.state_of("z") == QUEUED


def test_an_alternative_that_fits_is_no_slip(sim: RecordingCluster) -> None:
    w = sim.add_worker("gpus", resources="GPU=2")
    variants = [parse_demand({"gpu": 1}), parse_demand({"GPU": 1})]
    spec = TaskSpec("x", "f", b"", [], variants[0], 0, 0, variants)
    sim.client_says("c1", SubmitTasks([spec], {"f": b"func"}, ["x"]))
    assert sim.place() == [(w, "x")]
    assert sim.got(KeysFailed) == []


def test_check_demand_gives_each_verdict(sim: RecordingCluster) -> None:
    def verdict(spec: str) -> tuple[str, str]:
        return check_demand(sim.state, parse_demand(spec))

    assert verdict("GPU=1") == ("no workers", "no worker is connected yet: it waits for one")
    sim.add_worker("small", resources="GPU=2")
    sim.add_worker("big", resources="GPU=4 MEMORY=1GiB")
    assert verdict("GPU=4") == ("", "")
    assert verdict("gpu=1") == (
        "misnamed",
        "no connected worker offers gpu: did you mean GPU (not gpu)? "
        "(the workers offer GPU=4 on big, MEMORY=1 GiB on big)",
    )
    kind, text = verdict("GPU=8")
    assert kind == "unsatisfiable"
    assert text.startswith("no connected worker can ever provide it: largest GPU supply is 4")
    assert text.endswith("(the workers offer GPU=4 on big, MEMORY=1 GiB on big)")
    assert verdict("licence=1")[0] == "unsatisfiable"
    assert "no worker offers licence" in verdict("licence=1")[1]


# --- explain, story, snapshot ---------------------------------------------------------


def _why(sim: RecordingCluster, *keys: str) -> dict[str, str]:
    rid = len(sim.inbox["c1"]) + 1
    sim.client_says("c1", WhyRequest(rid, list(keys)))
    reply = sim.got(WhyReply)[-1]
    assert reply.request_id == rid
    return reply.reasons


def test_explain_names_the_short_resource_busy_threads_and_reservation(
    sim: RecordingCluster,
) -> None:
    sim.submit("x")
    assert "no workers are connected" in _why(sim, "x")["x"]
    sim.client_says("c1", ReleaseKeys(["x"]))
    sim.add_worker("gpus", nthreads=1, resources="GPU=2")
    sim.submit("a", resources="GPU=1")
    sim.place()
    sim.submit("big", resources="GPU=2")
    sim.submit("c", resources="GPU=1")
    sim.place()
    reasons = _why(sim, "a", "big", "c", "nope")
    assert "running on gpus" in reasons["a"] and "GPU=1" in reasons["a"]
    assert "needs GPU=2" in reasons["big"]
    assert "GPU 1 of 2 free" in reasons["big"]
    assert "all 1 threads busy" in reasons["big"]
    assert "holds the reservation on gpus" in reasons["big"]
    assert "reserved for older task 'big'" in reasons["c"]
    assert "not known" in reasons["nope"]


def test_a_retried_task_starts_before_the_younger_one_holding_the_reservation(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker("gpus", nthreads=2, resources="GPU=1")
    sim.submit("old", resources="GPU=1", retries=1)
    assert sim.place() == [(w, "old")]
    sim.submit("young", resources="GPU=1")
    sim.place()
    assert "holds the reservation on gpus" in _why(sim, "young")["young"]
    sim.raise_("old")  # retried: queued again, with its age
    assert sim.place() == [(w, "old")]
    assert "holds the reservation on gpus" in _why(sim, "young")["young"]
    sim.finish("old")
    assert sim.done() == ["old"]
    assert sim.place() == [(w, "young")]


def test_an_older_task_ready_later_takes_the_reservation_over(sim: RecordingCluster) -> None:
    w = sim.add_worker("gpus", nthreads=4, resources="GPU=2")
    sim.submit("busy", resources="GPU=2")
    sim.submit("input")
    sim.submit("old", ["input"], resources="GPU=2")  # submitted first, ready last
    sim.place()
    sim.submit("young", resources="GPU=1")
    sim.place()
    assert "holds the reservation on gpus" in _why(sim, "young")["young"]
    sim.finish("input")
    sim.place()
    reasons = _why(sim, "old", "young")
    assert "holds the reservation on gpus" in reasons["old"]
    assert (
        "gpus: GPU 0 of 2 free; reserved for older task 'old' (needs GPU=2)" in (reasons["young"])
    )
    sim.finish("busy")
    assert sim.place() == [(w, "old")]
    assert sim.done() == ["input", "busy"]


def test_why_says_how_a_younger_reservation_holder_stands(sim: RecordingCluster) -> None:
    sim.add_worker("w1", nthreads=4, resources="GPU=2")
    sim.add_worker("w2", nthreads=4, resources="GPU=2")
    sim.submit("x1", resources="GPU=2")
    sim.submit("x2", resources="GPU=2")
    sim.place()
    sim.submit("old", resources="GPU=2")
    sim.place()
    sim.submit("young", resources="GPU=1")
    sim.place()
    reasons = _why(sim, "old", "young")
    held = next(line for line in reasons["old"].splitlines() if "holds the reservation" in line)
    mine, theirs = ("w1", "w2") if "on w1" in held else ("w2", "w1")
    assert (
        f"{theirs}: GPU 0 of 2 free; reserved for task 'young' submitted after this one "
        f"(needs GPU=1); this task holds its own reservation on {mine}"
    ) in reasons["old"]
    assert f"{mine}: GPU 0 of 2 free; reserved for older task 'old'" in reasons["young"]
    sim.submit("urgent", resources="GPU=2", priority=5)
    sim.place()
    # It takes a reservation over, and says of the other that its holder is behind it.
    urgent = _why(sim, "urgent")["urgent"]
    assert "holds the reservation on" in urgent
    assert re.search(r"reserved for task '(old|young)' of lower priority", urgent), urgent


def test_explain_waiting_finished_failed_and_unsatisfiable(sim: RecordingCluster) -> None:
    sim.add_worker("w", nthreads=1)
    sim.submit_graph({"a": ([], None), "b": (["a"], None)}, wanted=["a", "b"])
    sim.submit("huge", resources="GPU=8")
    reasons = _why(sim, "b", "huge")
    assert "waiting for 1 of its 1 inputs: 'a'" in reasons["b"]
    assert "no worker offers GPU" in reasons["huge"]
    (notice,) = sim.got(Notice)  # what the client was told at once says the same
    assert "no worker offers GPU" in notice.text
    sim.place()
    sim.finish("a")
    assert "finished" in _why(sim, "a")["a"]
    assert sim.done() == ["a"]
    sim.place()
    sim.raise_("b")
    assert "failed (exception)" in _why(sim, "b")["b"]
    assert [e.key for e in sim.got(TaskErred)] == ["b"]


def test_explain_plain_task_with_busy_threads(sim: RecordingCluster) -> None:
    sim.add_worker("w", nthreads=1)
    for i in range(4):
        sim.submit(f"p{i}")
    sim.place()
    assert "threads on 1 workers are busy" in _why(sim, "p3")["p3"]


def test_story_lists_transitions_with_causes(sim: RecordingCluster) -> None:
    sim.add_worker("w", resources="GPU=1")
    sim.submit("x", resources="GPU=1", retries=1)
    sim.place()
    sim.raise_("x")
    sim.place()
    sim.finish("x")
    sim.client_says("c1", ReleaseKeys(["x"]))
    story = [row[2:] for row in sim.state.story("x")]
    assert story == [
        ("new", QUEUED, "submitted"),
        (QUEUED, PROCESSING, "assigned to w"),
        (PROCESSING, QUEUED, "raised on w; retrying (0 left)"),
        (
            QUEUED,
            PROCESSING,
            "assigned to w, where it raised once before: no worker where it raised less "
            "often could take it now",
        ),
        (PROCESSING, MEMORY, "finished on w"),
        (MEMORY, FORGOTTEN, "released"),
    ]
    sim.client_says("c1", StoryRequest(9, "x"))
    (reply,) = sim.got(StoryReply)
    assert reply.request_id == 9
    assert [tuple(row[2:]) for row in reply.story] == story
    assert all(row[1] == "x" for row in reply.story)
    assert all(isinstance(row[0], float) for row in reply.story)
    assert sim.done() == ["x"]  # once, after the retry
    assert sim.freed("w1") == ["x"]


def test_snapshot_shape(sim: RecordingCluster) -> None:
    w = sim.add_worker("gpus", nthreads=2, resources="GPU=2")
    sim.submit("a", resources="GPU=1.5")
    sim.submit("b")
    sim.place()
    snap = views.snapshot(sim.state)
    assert snap["type"] == "Scheduler"
    assert snap["clients"] == 1
    assert snap["tasks"] == {PROCESSING: 2}
    (info,) = snap["workers"].values()
    assert list(snap["workers"]) == [f"sim://{w}"]
    assert info["name"] == "gpus" and info["nthreads"] == 2
    assert info["resources"] == {"GPU": 2.0}
    assert info["free_resources"] == {"GPU": 0.5}
    assert info["processing"] == 2
    assert info["reserved_for"] is None
    sim.client_says("c1", InfoRequest(3))
    (reply,) = sim.got(InfoReply)
    assert reply.request_id == 3 and reply.info == snap


# --- gather and scatter relays ------------------------------------------------------


def test_gather_relays_through_the_worker(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    sim.submit("x")
    sim.run({})
    sim.client_says("c1", GatherRequest(5, ["x", "missing"]))
    (get,) = sim.worker_got(w, GetData)
    assert get.keys == ["x"]
    assert sim.got(GatherReply) == []
    sim.handle(FromWorker(w, [DataReply(get.request_id, {"x": b"value"}, [], {})], sim.now))
    (reply,) = sim.got(GatherReply)
    assert reply == GatherReply(5, {"x": b"value"}, ["missing"], {})
    assert sorted(sim.done()) == ["x"]  # each reported once


def test_gather_names_the_holders_of_large_results_and_relays_the_small(
    sim: RecordingCluster,
) -> None:
    sim.add_worker("w1")
    sim.add_worker("w2")
    sim.submit("big")
    sim.submit("small")
    sim.place()
    sim.finish("big", nbytes=5_000_000)
    sim.finish("small", nbytes=10)
    assert sorted(sim.done()) == ["big", "small"]
    big_on, small_on = sim.state.tasks["big"].worker, sim.state.tasks["small"].worker
    assert big_on is not None and small_on is not None
    sim.client_says("c1", GatherRequest(3, ["big", "small", "gone"], 1_000_000))
    (get,) = sim.worker_got(small_on, GetData)
    assert get.keys == ["small"]  # the large value is never asked of its worker
    sim.handle(FromWorker(small_on, [DataReply(get.request_id, {"small": b"s"}, [], {})], sim.now))
    (reply,) = sim.got(GatherReply)
    holder = sim.state.workers[big_on].address
    assert reply == GatherReply(3, {"small": b"s"}, ["gone"], {}, {"big": [holder]})
    # Without a threshold everything is relayed: the large value is forwarded by the
    # service from its worker, never held here, and the reply follows it.
    sim.client_says("c1", GatherRequest(4, ["big"]))
    (pipe,) = sim.piped
    assert (pipe.worker_id, pipe.client_id, pipe.request_id, pipe.keys) == (
        big_on,
        "c1",
        4,
        ["big"],
    )
    assert pipe.address == holder and sim.got(GatherReply)[1:] == []
    sim.handle(PipeEnded(pipe.relay_id, big_on, [], sim.now))
    assert sim.got(GatherReply)[1:] == [GatherReply(4, {}, [], {})]


def test_a_relayed_gather_answers_once_forwarded_and_small_results_are_in(
    sim: RecordingCluster,
) -> None:
    sim.add_worker("w1", nthreads=2)
    sim.add_worker("w2")
    for key in ("big", "other", "small"):
        sim.submit(key)
    sim.place()
    sim.finish("big", nbytes=PIPE_FROM)
    sim.finish("small", nbytes=PIPE_FROM - 1)
    sim.finish("other", nbytes=3 * PIPE_FROM)
    sim.done()
    sim.client_says("c1", GatherRequest(6, ["big", "small", "other"]))
    small_on = sim.state.tasks["small"].worker
    assert small_on is not None
    (get,) = sim.worker_got(small_on, GetData)
    assert get.keys == ["small"]
    pipes = {p.worker_id: p for p in sim.piped}
    assert sorted(k for p in pipes.values() for k in p.keys) == ["big", "other"]
    sim.handle(FromWorker(small_on, [DataReply(get.request_id, {"small": b"s"}, [], {})], 1))
    first, second = pipes.values()
    sim.handle(PipeEnded(first.relay_id, first.worker_id, [], sim.now))
    assert sim.got(GatherReply) == []  # a forward still on its way
    # Its worker went away mid-way: the client drops what it received of them.
    sim.handle(PipeEnded(second.relay_id, second.worker_id, second.keys, sim.now))
    (reply,) = sim.got(GatherReply)
    assert reply == GatherReply(6, {"small": b"s"}, second.keys, {})
    # A late or repeated report changes nothing.
    sim.handle(PipeEnded(second.relay_id, second.worker_id, [], sim.now))
    assert sim.got(GatherReply)[1:] == []


def test_a_forward_for_a_client_that_left_is_forgotten(sim: RecordingCluster) -> None:
    w = sim.add_worker("w1")
    sim.submit("big")
    sim.place()
    sim.finish("big", nbytes=2 * PIPE_FROM)
    sim.done()
    sim.add_client("c2")
    sim.client_says("c2", GatherRequest(1, ["big"]))
    (pipe,) = sim.piped
    sim.remove_client("c2")
    sim.handle(PipeEnded(pipe.relay_id, w, [], sim.now))
    assert sim.got(GatherReply, "c2") == [] and not sim.state.relays.gathers


def test_gather_of_only_large_results_answers_at_once(sim: RecordingCluster) -> None:
    sim.add_worker("w1")
    sim.submit("big")
    sim.place()
    sim.finish("big", nbytes=2_000_000)
    assert sim.done() == ["big"]
    sim.client_says("c1", GatherRequest(9, ["big"], 1_000_000))
    (reply,) = sim.got(GatherReply)
    assert reply.data == {} and list(reply.elsewhere) == ["big"]


def test_gather_of_nothing_in_memory_answers_at_once(sim: RecordingCluster) -> None:
    sim.submit("x")
    sim.client_says("c1", GatherRequest(1, ["x"]))
    assert sim.got(GatherReply) == [GatherReply(1, {}, ["x"], {})]


def test_gather_from_a_worker_that_leaves_counts_as_missing(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("w1")
    sim.submit("x")
    sim.run({})
    assert sim.done() == ["x"]
    sim.client_says("c1", GatherRequest(2, ["x"]))
    (get,) = sim.worker_got(w1, GetData)
    assert get.keys == ["x"] and sim.got(GatherReply) == []
    sim.remove_worker(w1)  # before it answered
    (reply,) = sim.got(GatherReply)
    assert reply == GatherReply(2, {}, ["x"], {})
    assert sim.got(KeysPending) == [KeysPending(["x"])]  # x is to be computed again


def test_scatter_is_parked_until_a_worker_joins(sim: RecordingCluster) -> None:
    sim.client_says("c1", ScatterRequest(7, {"d": b"data"}))
    assert sim.got(ScatterReply) == []
    w = sim.add_worker()
    (put,) = sim.worker_got(w, PutData)
    assert put.data == {"d": b"data"}
    sim.handle(FromWorker(w, [DataStored(put.request_id, ["d"], {"d": 4})], sim.now))
    assert sim.got(ScatterReply) == [ScatterReply(7, ["d"])]
    assert sim.state_of("d") == MEMORY
    # Scattered data can be used as an input and gathered back.
    sim.submit("e", deps=["d"])
    assert sim.state_of("e") == QUEUED
    sim.run({})
    sim.client_says("c1", ReleaseKeys(["d", "e"]))
    assert sim.state.tasks == {}
    assert sorted(sim.freed(w)) == ["d", "e"]
    assert sorted(sim.done()) == ["d", "e"]  # each reported once


def _scatter(sim: RecordingCluster, worker: str, key: str) -> None:
    """Client c1 scatters ``key`` and ``worker`` stores it; c1 hears it is stored and done."""
    sim.client_says("c1", ScatterRequest(1, {key: b"data"}))
    (put,) = sim.worker_got(worker, PutData)
    sim.handle(FromWorker(worker, [DataStored(put.request_id, [key], {key: 4})], sim.now))
    assert sim.got(ScatterReply) == [ScatterReply(1, [key])]
    assert sim.done() == [key]


def test_scattered_data_lost_with_its_worker_fails_as_lost(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    _scatter(sim, w, "d")
    sim.remove_worker(w)
    (failed,) = sim.got(KeysFailed)
    assert failed.keys == ["d"] and failed.kind == "lost" and "scattered" in failed.message
    # As for any lost result, the client first hears d is pending again; the failure
    # follows in the same breath, so it is the last word.
    assert sim.got(KeysPending) == [KeysPending(["d"])]
    assert sim.inbox["c1"][-1] == failed


def test_who_has(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    sim.submit("x")
    sim.run({})
    sim.client_says("c1", WhoHasRequest(4, ["x", "y"]))
    assert sim.got(WhoHasReply) == [WhoHasReply(4, {"x": [f"sim://{w}"]})]
    assert sorted(sim.done()) == ["x"]  # each reported once


def test_unexpected_messages_are_logged_not_fatal(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    sim.client_says("c1", TaskFinished("x", 1, 0.1, "int"))
    sim.handle(FromWorker(w, [SubmitTasks([], {}, [])], sim.now))
    assert [log.level for log in sim.logs[-2:]] == ["warning", "warning"]
    assert "unexpected TaskFinished" in sim.logs[-2].text
    assert sim.got(Unserved) == [Unserved("TaskFinished")]  # the client is told too


# --- regressions found by the stateful tests ------------------------------------------


def test_batch_may_list_dependents_before_their_inputs(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.submit_graph({"b": (["a"], None), "a": ([], None)}, wanted=["b"])
    assert (sim.state_of("a"), sim.state_of("b")) == (QUEUED, WAITING)
    sim.run({})
    assert sim.done() == ["b"]
    assert sorted(sim.freed("w1")) == ["a"]


def test_unsatisfiable_input_fails_a_wanted_dependent_with_the_reason(
    make_sim: Callable[..., RecordingCluster],
) -> None:
    sim = make_sim(SchedulerConfig(fail_unsatisfiable=True))
    sim.add_worker("small", resources="GPU=2")
    sim.submit_graph({"x": ([], "GPU=3"), "y": (["x"], None)}, wanted=["y"])
    (failed,) = sim.got(KeysFailed)
    assert failed.keys == ["y"] and failed.kind == "unsatisfiable"
    assert "largest GPU supply is 2 on small" in failed.message
    assert set(sim.state.tasks) == {"y"}


def test_reservation_is_dropped_when_an_input_is_lost(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("w1", nthreads=2)
    w2 = sim.add_worker("w2", nthreads=2, resources="GPU=2")
    sim.submit("x", resources="GPU=1")
    sim.place()
    sim.submit_graph({"a": ([], None), "b": (["a"], "GPU=2")}, wanted=["b"])
    sim.place()
    sim.finish("a")
    sim.place()
    assert sim.state.tasks["b"].reserved_on == w2
    assert sim.state.tasks["a"].worker == w1
    sim.remove_worker(w1)
    assert sim.state_of("b") == WAITING
    assert sim.state.tasks["b"].reserved_on is None
    assert sim.state.workers[w2].reserved_by is None


def _gpu_task_started_on_its_input(sim: RecordingCluster) -> tuple[str, str]:
    """``a`` done on plain w1, then ``b`` (GPU=1, needing ``a``) started on w2 once it
    joined; the two workers' ids."""
    w1 = sim.add_worker("w1")
    sim.submit_graph({"a": ([], None), "b": (["a"], "GPU=1")}, wanted=["b"])
    assert len(sim.got(Notice)) == 1  # no GPU worker yet: the client is warned about b
    sim.place()
    sim.finish("a")
    w2 = sim.add_worker("w2", resources="GPU=1")
    assert sim.place() == [(w2, "b")]
    return w1, w2


def test_task_given_back_after_its_input_was_lost_waits_for_it(sim: RecordingCluster) -> None:
    w1, w2 = _gpu_task_started_on_its_input(sim)
    sim.remove_worker(w1)  # a's only copy goes while b runs on w2
    assert sim.state_of("a") == QUEUED
    assert sim.state_of("b") == PROCESSING
    sim.state.tasks["b"].retries = 1
    sim.raise_("b")  # retried: it must wait for a again, not start without it
    assert sim.state_of("b") == WAITING
    spans = by_key(sim.run({}))
    assert spans["a"].end <= spans["b"].start
    assert sim.done() == ["b"]
    assert sim.freed(w2) == ["a"]  # recomputed there, dropped once b finished


def test_cancelled_running_task_wanted_again_reports_at_once(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.add_client("c2")
    sim.submit("x")
    sim.place()
    sim.client_says("c1", CancelKeys(["x"]))
    assert [f.keys for f in sim.got(KeysFailed, "c1")] == [["x"]]
    assert sim.freed("w1") == ["x"]
    sim.remove_client("c1")
    sim.client_says("c2", SubmitTasks([], {}, ["x"]))  # asks for it, still running
    (failed,) = sim.got(KeysFailed, "c2")
    assert failed.kind == "cancelled"
    sim.finish("x")
    assert sim.state_of("x") == ERRED
    assert len(sim.got(KeysFailed, "c2")) == 1


def test_cancelled_task_submitted_again_runs_again(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    sim.submit("x")
    sim.place()
    sim.client_says("c1", CancelKeys(["x"]))
    assert [f.keys for f in sim.got(KeysFailed)] == [["x"]]
    assert sim.freed(w) == ["x"]  # the cancelled run's result is to be dropped
    sim.submit("x")  # the same task again while the cancelled run is still going
    sim.finish("x")  # that run's result was discarded; the task is queued again
    assert sim.done() == []
    assert sim.place() == [(w, "x")]
    sim.finish("x")
    assert sim.state_of("x") == MEMORY and sim.done() == ["x"]
    sim.client_says("c1", CancelKeys(["x"]), ReleaseKeys(["x"]))
    assert sim.freed(w) == ["x", "x"]  # finished: the cancel is a no-op, the release frees
    sim.submit("y")
    sim.client_says("c1", CancelKeys(["y"]))
    assert sim.state_of("y") == ERRED
    assert [(f.keys, f.kind) for f in sim.got(KeysFailed)] == [
        (["x"], "cancelled"),
        (["y"], "cancelled"),
    ]
    sim.submit("y")  # cancelled before it ran: a fresh task
    assert sim.place() == [(w, "y")]


def test_cancelling_twice_reports_once(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.submit("x")
    sim.place()
    sim.client_says("c1", CancelKeys(["x"]), CancelKeys(["x"]))
    assert len(sim.got(KeysFailed)) == 1
    assert sorted(sim.freed("w1")) == ["x"]


def test_dependent_of_a_cancelled_running_task_fails_when_it_settles(
    sim: RecordingCluster,
) -> None:
    sim.add_worker()
    sim.submit("x")
    sim.place()
    sim.client_says("c1", CancelKeys(["x"]))
    sim.client_says("c1", ReleaseKeys(["x"]))
    sim.submit("y", deps=["x"])  # x still runs, so y waits for it
    assert sim.state_of("y") == WAITING
    sim.finish("x")
    assert sim.state_of("y") == ERRED
    assert [f.keys for f in sim.got(KeysFailed)] == [["x"], ["y"]]
    assert sim.state_of("x") == FORGOTTEN
    assert sorted(sim.freed("w1")) == ["x"]


def test_running_dependent_keeps_a_failed_input_registered(sim: RecordingCluster) -> None:
    w1 = sim.add_worker("w1", nthreads=2)
    sim.submit_graph({"a": ([], None), "b": (["a"], "GPU=1")}, wanted=["a", "b"])
    assert len(sim.got(Notice)) == 1  # no GPU worker yet: the client is warned about b
    sim.place()
    sim.finish("a")
    w2 = sim.add_worker("w2", resources="GPU=1")
    sim.place()
    sim.remove_worker(w1)  # a is recomputed while b still runs on w2
    assert sim.done() == ["a"] and sim.got(KeysPending) == [KeysPending(["a"])]
    w3 = sim.add_worker("w3")
    assert sim.place() == [(w3, "a")]
    sim.raise_("a")  # b fails with it, but its worker has not reported yet
    assert sim.state_of("b") == PROCESSING
    assert [e.key for e in sim.got(TaskErred)] == ["a", "b"]
    assert sim.freed(w2) == ["b"]  # whatever b's run gives is dropped
    check_invariants(sim.state)
    sim.finish("b")
    assert sim.state_of("b") == ERRED
    assert sim.free(w2) == {"GPU": 1.0}


def _report_missing(sim: RecordingCluster, key: str, dep: str) -> None:
    """The worker running ``key`` could not fetch ``dep`` from the holder it was told of."""
    worker_id = sim.worker_of(key)
    compute = sim.running[worker_id].pop(key)
    msg = MissingDependency(key, dep, compute.who_has[dep], "")
    sim.handle(FromWorker(worker_id, [msg], sim.now))


def test_missing_dependency_recomputes_the_input_then_reruns(sim: RecordingCluster) -> None:
    w1, w2 = _gpu_task_started_on_its_input(sim)
    _report_missing(sim, "b", "a")
    assert (sim.state_of("a"), sim.state_of("b")) == (QUEUED, WAITING)
    assert sim.free(w2) == {"GPU": 1.0}
    assert "a" not in sim.state.workers[w1].has_what
    assert sim.freed(w1) == ["a"]  # whatever w1 still has under that key is stale
    spans = by_key(sim.run({}))
    assert spans["a"].end <= spans["b"].start
    assert sim.done() == ["b"]
    assert sim.freed(w1) == ["a", "a"]  # a ran there again; dropped once b finished


def test_missing_dependency_whose_input_was_released_is_recomputed(
    sim: RecordingCluster,
) -> None:
    w1 = sim.add_worker("w1", nthreads=2)
    sim.submit_graph({"x": ([], None), "a": (["x"], None), "b": (["a"], "GPU=1")}, wanted=["b"])
    assert len(sim.got(Notice)) == 1  # no GPU worker yet: the client is warned about b
    sim.run({})
    assert sim.state_of("x") == RELEASED  # a finished, so nobody needed x's data any more
    assert sim.freed(w1) == ["x"]
    w2 = sim.add_worker("w2", resources="GPU=1")
    assert sim.place() == [(w2, "b")]
    _report_missing(sim, "b", "a")  # a is gone: x and then a are computed again
    assert (sim.state_of("x"), sim.state_of("a"), sim.state_of("b")) == (QUEUED, WAITING, WAITING)
    assert sim.free(w2) == {"GPU": 1.0}
    assert sim.freed(w1) == ["x", "a"]  # w1's stale a goes too
    sim.run({})
    assert sim.done() == ["b"] and not sim.got(KeysFailed)
    assert sim.freed(w1) == ["x", "a", "x", "a"]  # each recomputed input dropped once used


def test_missing_dependency_of_a_cancelled_task_does_not_rerun_it(
    sim: RecordingCluster,
) -> None:
    w1 = sim.add_worker("w1")
    sim.submit_graph({"a": ([], None), "b": (["a"], "GPU=1")}, wanted=["a", "b"])
    assert len(sim.got(Notice)) == 1  # no GPU worker yet: the client is warned about b
    sim.place()
    sim.finish("a")
    assert sim.done() == ["a"]
    w2 = sim.add_worker("w2", resources="GPU=1")
    sim.place()
    sim.client_says("c1", CancelKeys(["b"]))
    assert sim.freed(w2) == ["b"]
    _report_missing(sim, "b", "a")
    assert sim.state_of("b") == ERRED
    (failed,) = sim.got(KeysFailed)  # at the cancel only
    assert failed.keys == ["b"] and failed.kind == "cancelled"
    # a is lost all the same: the client waits for it again, w1 drops its stale copy.
    assert sim.got(KeysPending) == [KeysPending(["a"])]
    assert sim.freed(w1) == ["a"]
    assert sim.place() == [(sim.worker_of("a"), "a")]  # a is still wanted: recomputed
    assert "b" not in sim.all_running()
    assert sim.free(w2) == {"GPU": 1.0}


def test_resubmitting_a_cancelled_key_keeps_its_function(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    sim.submit("x", resources=None)
    sim.client_says("c1", CancelKeys(["x"]))
    (failed,) = sim.got(KeysFailed)
    assert failed.keys == ["x"] and failed.kind == "cancelled"
    assert "f" in sim.state.functions  # still used by the cancelled record
    sim.submit("x")  # drops the cancelled record (its function's last user) first
    assert sim.place() == [(w, "x")]


# --- lineage: recomputing a lost result whose inputs were released ---------------------


def test_a_lost_result_is_recomputed_from_released_inputs(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=1, name="first")
    sim.submit_graph({"a": ([], None), "b": (["a"], None), "c": (["b"], None)}, wanted=["c"])
    for key in "abc":
        sim.place()
        sim.finish(key)
    assert sim.state_of("a") == sim.state_of("b") == RELEASED
    spare = sim.add_worker(nthreads=1, name="spare")
    sim.remove_worker(w)  # c's only copy is gone; a and b hold no data anywhere
    assert sim.got(KeysPending) == [KeysPending(["c"])]
    assert (sim.state_of("a"), sim.state_of("b"), sim.state_of("c")) == (QUEUED, WAITING, WAITING)
    for key in "abc":
        assert sim.place() == [(spare, key)]
        sim.finish(key)
    assert sim.done() == ["c", "c"]
    assert sim.state_of("c") == MEMORY and sim.state_of("a") == RELEASED
    story = [row[4] for row in sim.state.story("a")]
    assert "needed to recompute b" in story
    assert sorted(sim.freed("w1")) == ["a", "b"]
    assert sorted(sim.freed("w2")) == ["a", "b"]


def test_wanting_a_released_key_again_recomputes_it(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=1)
    sim.submit_graph({"a": ([], None), "b": (["a"], None)}, wanted=["b"])
    for key in "ab":
        sim.place()
        sim.finish(key)
    assert sim.state_of("a") == RELEASED
    sim.submit_graph({"d": (["a"], None)}, wanted=["d"])  # a new task on a released input
    assert sim.place() == [(w, "a")]
    sim.finish("a")
    assert sim.place() == [(w, "d")]
    sim.finish("d")
    assert sim.done() == ["b", "d"]
    assert sorted(sim.freed("w1")) == ["a", "a"]


def test_a_long_released_chain_is_recomputed_and_dropped_without_recursion(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker(nthreads=1)
    n = 5_000
    graph = {f"t{i}": ([f"t{i - 1}"] if i else [], None) for i in range(n)}
    sim.submit_graph(graph, wanted=[f"t{n - 1}"])
    for i in range(n):
        sim.place()
        sim.finish(f"t{i}")
    spare = sim.add_worker(nthreads=1)
    sim.remove_worker(w)
    assert sim.state_of("t0") == QUEUED and sim.state_of(f"t{n - 2}") == WAITING
    assert sim.got(KeysPending) == [KeysPending([f"t{n - 1}"])]
    for i in range(n):
        assert sim.place() == [(spare, f"t{i}")]
        sim.finish(f"t{i}")
    assert sim.done() == [f"t{n - 1}"] * 2
    sim.client_says("c1", ReleaseKeys([f"t{n - 1}"]))
    assert sim.state.tasks == {}
    # Each input was dropped once its dependent finished, on both workers; the last
    # result with the release.
    assert sim.freed(w) == [f"t{i}" for i in range(n - 1)]
    assert sim.freed(spare) == [f"t{i}" for i in range(n)]


def test_a_lost_result_whose_released_input_was_scattered_fails_clearly(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker(nthreads=1)
    _scatter(sim, w, "data")
    sim.submit_graph({"use": (["data"], None)}, wanted=["use"])
    sim.place()
    sim.finish("use")
    assert sim.done() == ["data", "use"]
    sim.client_says("c1", ReleaseKeys(["data"]))
    assert sim.state_of("data") == FORGOTTEN  # scattered: nothing to recompute it from
    assert sim.freed(w) == ["data"]
    sim.add_worker(nthreads=1)
    sim.remove_worker(w)
    (failed,) = sim.got(KeysFailed)
    assert failed.keys == ["use"] and "input 'data' is gone" in failed.message
    # Pending first, as for any lost result; the failure follows at once, last.
    assert sim.got(KeysPending) == [KeysPending(["use"])]
    assert sim.inbox["c1"][-1] == failed


def test_a_new_task_on_released_input_that_cannot_be_recomputed_fails_cleanly(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker(nthreads=1)
    _scatter(sim, w, "data")
    sim.submit_graph({"a": (["data"], None), "b": (["a"], None)}, wanted=["b"])
    sim.run({})
    assert sim.done() == ["data", "b"]
    sim.client_says("c1", ReleaseKeys(["data"]))  # gone; a stays as b's lineage
    assert sim.state_of("a") == RELEASED
    assert sim.freed(w) == ["a", "data"]
    sim.submit_graph({"c": (["a"], None)}, wanted=["c"])  # a must be recomputed: impossible
    failed = sim.got(KeysFailed)
    assert [f.keys for f in failed] == [["c"]] and "'data' is gone" in failed[0].message


def test_a_recomputed_input_released_again_keeps_its_lineage(sim: RecordingCluster) -> None:
    w = sim.add_worker(nthreads=2)
    sim.submit_graph({"d": ([], None), "e": (["d"], None), "f": (["d"], None)}, wanted=["e", "f"])
    sim.run({})
    assert sim.state_of("d") == RELEASED and sim.freed(w) == ["d"]
    sim.client_says("c1", ReleaseKeys(["e"]))  # e goes; d stays for f
    assert sim.freed(w) == ["d", "e"]
    spare = sim.add_worker(nthreads=2)
    sim.remove_worker(w)  # f lost: d is recomputed, then released again with f done
    sim.run({})
    assert sim.state_of("f") == MEMORY and sim.state_of("d") == RELEASED
    assert sim.freed(spare) == ["d"]
    sim.remove_worker(spare)
    third = sim.add_worker(nthreads=2)
    sim.run({})  # and f can be recomputed once more
    assert sim.state_of("f") == MEMORY and not sim.got(KeysFailed)
    assert sim.freed(third) == ["d"]
    assert sim.got(KeysPending) == [KeysPending(["f"])] * 2  # once per loss
    assert sim.done() == ["e", "f", "f", "f"]


def test_a_message_nobody_took_fails_the_check_unless_allowed() -> None:
    cluster = RecordingCluster()
    cluster.add_client("c1")
    w = cluster.add_worker("w")
    cluster.submit("x")
    assert cluster.place() == [(w, "x")]
    cluster.finish("x")
    with pytest.raises(UnexpectedMessages, match=r"to c1: KeysDone\(keys=\['x'\]"):
        cluster.check_all_taken()
    assert cluster.done() == ["x"]
    cluster.check_all_taken()
    cluster.client_says("c1", ReleaseKeys(["x"]))
    cluster.allow(FreeKeys)
    cluster.check_all_taken()


# --- placement near large inputs -----------------------------------------------------


def _busy_holder(
    sim: RecordingCluster, nbytes: int, duration: float, busy: float = 0.01
) -> tuple[str, str]:
    """A one-thread worker holding ``x`` of ``nbytes``, its thread taken by a task of
    ``busy`` seconds (and for 10 ms ones its pipeline by another); and an idle worker
    beside it. Tasks of the group ``use`` take ``duration``."""
    holder = sim.add_worker("holder")
    sim.submit("x")
    sim.place()
    sim.finish("x", nbytes=nbytes)
    assert sim.done() == ["x"]
    sim.measured("busy-1", busy)
    sim.measured("use", duration)
    sim.submit("busy-1")
    sim.submit("busy-2")
    queued = [(holder, "busy-1"), (holder, "busy-2")] if busy <= 0.01 else [(holder, "busy-1")]
    assert sim.place() == queued
    return holder, sim.add_worker("idle")


def test_a_task_waits_for_the_busy_worker_holding_its_large_input(sim: RecordingCluster) -> None:
    holder, _ = _busy_holder(sim, nbytes=10**9, duration=0.01)
    sim.submit("use", ["x"])
    # Moving 1 GB would take about 10 s; the two tasks ahead, about 0.02 s. It is
    # short work (10 ms), so it may wait in the holder's queue.
    assert sim.place() == [(holder, "use")]


def test_a_task_moves_its_input_when_waiting_would_take_longer(
    make_sim: Callable[..., RecordingCluster],
) -> None:
    small = make_sim()
    _, idle = _busy_holder(small, nbytes=1000, duration=0.01)
    small.submit("use", ["x"])
    assert small.place() == [(idle, "use")]  # a few bytes: any free thread
    slow = make_sim()
    _, idle = _busy_holder(slow, nbytes=10**9, duration=60.0, busy=30.0)
    slow.submit("use", ["x"])
    # 30 s behind busy-1 is longer than moving 1 GB: not queued on the holder, it
    # waits in the scheduler for the first free thread (busy-2 took the idle one).
    assert slow.place() == [(idle, "busy-2")]
    assert slow.state.tasks["use"].state == QUEUED


def test_long_work_waits_for_its_large_input_only_while_that_is_quicker(
    sim: RecordingCluster,
) -> None:
    holder, _ = _busy_holder(sim, nbytes=10**9, duration=60.0)
    sim.submit("use", ["x"])
    # A minute's task, but the 20 ms ahead of it beat moving 1 GB (10 s).
    assert sim.place() == [(holder, "use")]


# --- inputs fetched ahead for a reserving task ----------------------------------------


def _reserving(sim: RecordingCluster, nbytes: int) -> tuple[str, str]:
    """``t2`` (GPU=1) needs ``x`` of ``nbytes`` held by worker "data", and waits for
    the one GPU, which ``t1`` holds on worker "gpu": it reserves "gpu"."""
    data = sim.add_worker("data")
    sim.submit("x")
    sim.place()
    sim.finish("x", nbytes=nbytes)
    assert sim.done() == ["x"]
    gpu = sim.add_worker("gpu", nthreads=2, resources="GPU=1")
    sim.submit("t1", resources="GPU=1")
    assert sim.place() == [(gpu, "t1")]
    sim.submit("t2", ["x"], resources="GPU=1")
    assert sim.place() == []
    assert sim.state.tasks["t2"].reserved_on == gpu
    return data, gpu


def test_a_reserving_task_has_its_large_inputs_fetched_ahead_where_it_will_run(
    sim: RecordingCluster,
) -> None:
    data, gpu = _reserving(sim, nbytes=PREFETCH_FROM)
    (prefetch,) = sim.worker_got(gpu, Prefetch)
    assert prefetch.who_has == {"x": [sim.state.workers[data].address]}
    sim.finish("t1")
    assert sim.place() == [(gpu, "t2")]
    assert sim.worker_got(gpu, DropPrefetch) == []  # it started there: they are its own
    assert sim.done()[-1] == "t1"


def test_inputs_fetched_ahead_are_dropped_when_their_task_will_not_run_there(
    sim: RecordingCluster,
) -> None:
    _, gpu = _reserving(sim, nbytes=PREFETCH_FROM)
    assert len(sim.worker_got(gpu, Prefetch)) == 1
    sim.client_says("c1", CancelKeys(["t2"]))
    assert sim.worker_got(gpu, DropPrefetch) == [DropPrefetch(["x"])]
    assert not sim.state.prefetches
    sim.allow(KeysFailed, FreeKeys)


def test_small_inputs_are_not_fetched_ahead(sim: RecordingCluster) -> None:
    _, gpu = _reserving(sim, nbytes=PREFETCH_FROM - 1)
    assert sim.worker_got(gpu, Prefetch) == [] and not sim.state.prefetches


# --- copies workers fetch and keep ----------------------------------------------------


def test_a_copy_a_worker_fetched_and_kept_is_a_holder_until_released(
    sim: RecordingCluster,
) -> None:
    w1 = sim.add_worker("w1")
    w2 = sim.add_worker("w2")
    sim.submit("x")
    assert sim.place() == [(w1, "x")]
    sim.finish("x", nbytes=10**7)  # 0.1 s to move: less than waiting for "blocker"
    sim.submit("blocker")
    sim.submit("use-1", ["x"])
    assert sim.place() == [(w1, "blocker"), (w2, "use-1")]
    sim.worker_says(w2, CopiesKept(["x"]))  # fetched by w2 for use-1: kept there
    assert sorted(sim.state.tasks["x"].replicas or ()) == [w2]
    assert "x" in sim.state.workers[w2].has_what
    sim.submit("use-2", ["x"])
    sim.finish("use-1")
    assert sim.place() == [(w2, "use-2")]  # where a copy already is
    assert sim.worker_got(w2, ComputeTask)[-1].who_has["x"] == ["sim://w1", "sim://w2"]
    sim.worker_says(w1, CopiesKept(["gone"]))  # a key the scheduler no longer has
    assert sim.freed(w1) == ["gone"]
    sim.finish("use-2")
    sim.finish("blocker")
    sim.client_says("c1", ReleaseKeys(["x"]))
    assert "x" in sim.freed(w1) and "x" in sim.freed(w2)  # every holder drops it
    assert sorted(sim.done()) == ["blocker", "use-1", "use-2", "x"]


def test_a_kept_copy_reported_as_its_worker_is_given_the_key_to_compute_stays(
    sim: RecordingCluster,
) -> None:
    # w2 fetched x from w1 for use-1 and keeps it; w1 leaves before that report
    # arrives, and the scheduler gives x to w2 to compute again. The report and the
    # ComputeTask cross: w2 answers with its copy ("held here"), so the scheduler
    # must not free that copy as a stale one.
    w1 = sim.add_worker("w1")
    w2 = sim.add_worker("w2")
    sim.submit("x")
    assert sim.place() == [(w1, "x")]
    sim.finish("x", nbytes=10**7)
    sim.submit("blocker")
    sim.submit("use-1", ["x"])
    assert sim.place() == [(w1, "blocker"), (w2, "use-1")]
    sim.finish("use-1")
    sim.remove_worker(w1)
    assert [m.keys for m in sim.got(KeysPending)] == [["x"]]  # to be computed again
    assert sim.place() == [(w2, "x")]
    sim.worker_says(w2, CopiesKept(["x"]))  # sent before the ComputeTask arrived
    assert "x" not in sim.freed(w2)
    sim.finish("x")  # held here: reported at once
    assert sim.state.tasks["x"].worker == w2 and "x" in sim.state.workers[w2].has_what
    assert sim.place() == [(w2, "blocker")]
    sim.finish("blocker")
    assert sorted(sim.done()) == ["blocker", "use-1", "x", "x"]


def test_a_gpu_worker_past_its_memory_target_gets_gpu_work_last(sim: RecordingCluster) -> None:
    full = sim.add_worker("full", nthreads=2, resources="GPU=2", memory_limit=1000)
    roomy = sim.add_worker("roomy", nthreads=2, resources="GPU=2", memory_limit=1000)
    sim.submit("held", resources="GPU=1")
    sim.submit("running", resources="GPU=1")
    assert sim.place() == [(full, "held"), (roomy, "running")]
    sim.finish("held", nbytes=700)
    for key in ("g1", "g2"):
        sim.submit(key, resources="GPU=1")
    # roomy runs one GPU task already; full runs none, but holds 70 % of its limit.
    assert sim.place() == [(roomy, "g1"), (full, "g2")]
    for key in ("running", "g1", "g2"):
        sim.finish(key)
    assert sorted(sim.done()) == ["g1", "g2", "held", "running"]


def test_a_worker_past_its_memory_target_gets_new_work_last(sim: RecordingCluster) -> None:
    full = sim.add_worker("full", memory_limit=1000)
    roomy = sim.add_worker("roomy", nthreads=2, memory_limit=1000)
    sim.submit("held")
    sim.submit("running")
    assert sim.place() == [(full, "held"), (roomy, "running")]
    sim.finish("held", nbytes=700)  # past 60 % of its limit in results
    sim.submit("new-1")
    assert sim.place() == [(roomy, "new-1")]  # though "full" has the idler thread
    sim.submit("new-2")
    assert sim.place() == [(full, "new-2")]  # last, not never: nobody else has room
    sim.finish("running")
    sim.finish("new-1")
    sim.finish("new-2")
    assert sorted(sim.done()) == ["held", "new-1", "new-2", "running"]
