"""Shares: each client's work gets its weighted fair share of every resource, by
dominant resource fairness, and never more than its quota (``scheduler/shares.py``).

Pure: simulated workers and time (``SimulatedCluster.run``), milliseconds each.
"""

from __future__ import annotations

import pytest

from apportion.core.resources import parse_demand
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.scheduler.backlog import backlog
from apportion.scheduler.explain import explain
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import PROCESSING, QUEUED
from apportion.scheduler.shares import THREADS, FairPass, holdings
from apportion.testing.simulation import Interval, SimulatedCluster
from share_sims import cluster, queue

GPU = parse_demand({"GPU": 1})


def play(sim: SimulatedCluster, seconds: float) -> list[Interval]:
    """``SimulatedCluster.run`` from where ``sim`` stands: the tasks already running
    began now; every task takes ``seconds``."""
    ends = [(sim.now + seconds, key) for keys in sim.running.values() for key in keys]
    begun = dict.fromkeys((key for _, key in ends), sim.now)
    intervals: list[Interval] = []
    while True:
        for _, key in sim.place():
            begun[key] = sim.now
            ends.append((sim.now + seconds, key))
        if not ends:
            return intervals
        ends.sort()
        end, key = ends.pop(0)
        sim.now = end
        worker = sim.worker_of(key)
        sim.finish(key, duration=seconds)
        intervals.append(Interval(key, worker, begun[key], end))


def busy_seconds(intervals: list[Interval], prefix: str, until: float) -> float:
    """Unit-seconds the tasks of ``prefix`` ran before ``until``."""
    return sum(max(0.0, min(i.end, until) - i.start) for i in intervals if i.key.startswith(prefix))


def test_a_second_client_starts_at_the_next_freed_unit() -> None:
    # The case: GPU=2, A queues 100 tasks of 0.2 s, then B one. B used to
    # start after 9.6 s, when A's queue was empty.
    sim = cluster("a", "b")
    sim.add_worker("w", nthreads=4, resources={"GPU": 2})
    queue(sim, "a", 100, {"GPU": 1})
    sim.place()
    queue(sim, "b", 1, {"GPU": 1})
    intervals = play(sim, 0.2)
    started = {i.key: i.start for i in intervals}
    assert started["b-0"] == pytest.approx(0.2)
    check_invariants(sim.state)


def test_two_clients_share_the_gpus_half_and_half_while_both_wait() -> None:
    sim = cluster("a", "b")
    sim.add_worker("w", nthreads=8, resources={"GPU": 4})
    keys = queue(sim, "a", 200, {"GPU": 1})
    sim.place()  # A takes every GPU first: nobody else waits
    keys += queue(sim, "b", 200, {"GPU": 1})
    intervals = play(sim, 1.0)
    # Both wait until t=100 at the least; from the first freed units on, 2 and 2.
    a, b = busy_seconds(intervals, "a-", 50.0), busy_seconds(intervals, "b-", 50.0)
    assert a + b == pytest.approx(200.0)
    assert b / (a + b) == pytest.approx(0.5, abs=0.02)


def test_weights_3_to_1_give_75_and_25_percent_of_gpu_time() -> None:
    sim = cluster("a", "b")
    sim.state.shares.set("a", weight=3)
    sim.add_worker("w", nthreads=8, resources={"GPU": 4})
    keys = queue(sim, "a", 200, {"GPU": 1}) + queue(sim, "b", 200, {"GPU": 1})
    intervals = sim.run(dict.fromkeys(keys, 1.0))
    a, b = busy_seconds(intervals, "a-", 40.0), busy_seconds(intervals, "b-", 40.0)
    assert a / (a + b) == pytest.approx(0.75, abs=0.02)


def test_plain_tasks_share_the_threads() -> None:
    sim = cluster("a", "b")
    sim.add_worker("w1", nthreads=2)
    sim.add_worker("w2", nthreads=2)
    sim.measured("a-0", 1.0)  # long work: never queued ahead of a free thread
    sim.measured("b-0", 1.0)
    keys = queue(sim, "a", 100)
    sim.place()
    keys += queue(sim, "b", 100)
    intervals = play(sim, 1.0)
    started = {i.key: i.start for i in intervals}
    assert started["b-0"] == pytest.approx(1.0)  # the first thread freed
    a, b = busy_seconds(intervals, "a-", 20.0), busy_seconds(intervals, "b-", 20.0)
    assert b / (a + b) == pytest.approx(0.5, abs=0.05)


def test_a_share_with_nothing_waiting_leaves_its_part_to_others() -> None:
    sim = cluster("a", "b")
    sim.add_worker("w", nthreads=4, resources={"GPU": 4})
    queue(sim, "b", 1, {"GPU": 1})
    keys = queue(sim, "a", 12, {"GPU": 1})
    intervals = sim.run(dict.fromkeys([*keys, "b-0"], 1.0))
    # b's one task takes one GPU for one second; a has every other GPU all along.
    assert max(i.end for i in intervals) == pytest.approx(4.0)


def test_dominant_share_counts_the_resource_each_share_uses_most() -> None:
    # A asks for memory, B for GPUs: each is served by its own scarce resource, and a
    # thread counts too (DRF across every resource).
    sim = cluster("a", "b")
    w = sim.add_worker("w", nthreads=10, resources={"GPU": 4, "memory": 100})
    queue(sim, "a", 50, {"memory": 10})
    queue(sim, "b", 50, {"GPU": 1})
    sim.place()
    fair = FairPass(sim.state.shares, sim.state.workers, sim.state.tasks)
    held = holdings(sim.state.workers, sim.state.tasks)
    # Progressive filling: a's task is a tenth of memory and of threads (0.1), b's a
    # quarter of the GPUs (0.25); the one with less goes next, ties to the older
    # work, until the 10 threads are taken: a holds 7 (0.7), b 3 GPUs (0.75).
    assert held["a"] == {THREADS: 7, "memory": 70 * 10_000}
    assert held["b"] == {THREADS: 3, "GPU": 3 * 10_000}
    assert fair.dominant("a") == pytest.approx(0.7)
    assert fair.dominant("b") == pytest.approx(0.75)
    assert sim.state.workers[w].ledger.free["GPU"] == 10_000


def test_a_quota_is_never_exceeded_even_on_an_idle_cluster() -> None:
    sim = cluster("a")
    sim.state.shares.set("a", quota={"GPU": 2 * 10_000})
    sim.add_worker("w", nthreads=8, resources={"GPU": 8})
    keys = queue(sim, "a", 10, {"GPU": 1})
    started = sim.place()
    assert len(started) == 2
    waiting = next(k for k in keys if sim.state.tasks[k].state == QUEUED)
    text = explain(sim.state, waiting)
    assert "quota of GPU" in text and "'a'" in text, text
    intervals = play(sim, 1.0)
    for t in (0.5, 1.5, 2.5, 3.5, 4.5):
        assert sum(1 for i in intervals if i.start <= t < i.end) == 2
    assert max(i.end for i in intervals) == pytest.approx(5.0)
    check_invariants(sim.state)


def test_a_quota_leaves_the_rest_to_other_shares_and_counts_alternatives() -> None:
    sim = cluster("a", "b")
    sim.state.shares.set("a", quota={"GPU": 10_000})
    sim.add_worker("w", nthreads=8, resources={"GPU": 4, "cpus": 8})
    # An alternative past the quota is skipped: a's second task runs on CPUs.
    options = [{"GPU": 10_000}, {"cpus": 40_000}]
    specs = [TaskSpec(f"a-{i}", "f", b"", [], options[0], 0, 0, options) for i in range(3)]
    sim.client_says("a", SubmitTasks(specs, {"f": b"func"}, [s.key for s in specs]))
    queue(sim, "b", 4, {"GPU": 1})
    sim.place()
    running = {k for k, t in sim.state.tasks.items() if t.state == PROCESSING}
    held = holdings(sim.state.workers, sim.state.tasks)
    assert held["a"].get("GPU", 0) <= 10_000
    assert held["b"]["GPU"] == 3 * 10_000
    assert {"a-0", "a-1", "a-2"} <= running  # one on a GPU, two on 4 CPUs each


def test_a_reservation_is_kept_against_other_shares_that_hold_more() -> None:
    # B's GPU=2 task is not starved by A's stream of GPU=1 tasks: once B is the
    # share further below its fair share, what frees is kept for it.
    sim = cluster("a", "b")
    sim.add_worker("w", nthreads=4, resources={"GPU": 2})
    queue(sim, "a", 30, {"GPU": 1})
    sim.place()
    sim.submit("big", resources={"GPU": 2}, client="b")
    intervals = play(sim, 1.0)
    started = {i.key: i.start for i in intervals}
    assert started["big"] == pytest.approx(1.0)


def test_one_share_places_exactly_as_before() -> None:
    # The Guild example, through one client: its order is today's (3T makespan).
    sim = cluster("c1")
    sim.add_worker("w", nthreads=4, resources={"gpu0": 1, "gpu1": 1})
    for key, res in [
        ("aaa", {"gpu0": 1}),
        ("bbb", {"gpu0": 1}),
        ("ccc", {"gpu0": 1, "gpu1": 1}),
        ("ddd", {"gpu1": 1}),
    ]:
        sim.submit(key, resources=res)
    intervals = sim.run({})
    assert [(i.key, i.start) for i in sorted(intervals, key=lambda i: (i.start, i.key))] == [
        ("aaa", 0.0),
        ("ddd", 0.0),
        ("bbb", 1.0),
        ("ccc", 2.0),
    ]


def test_bad_weights_and_quotas_are_refused() -> None:
    sim = cluster()
    with pytest.raises(ValueError, match="weight must be a positive number"):
        sim.state.shares.set("a", weight=0)
    with pytest.raises(ValueError, match="quota cannot be negative"):
        sim.state.shares.set("a", quota={"GPU": -1})


def test_the_backlog_counts_a_kind_once_whoever_waits_for_it() -> None:
    # A cluster that grows reads one line per kind of request, not one per share.
    sim = cluster("a", "b")
    queue(sim, "a", 3, {"GPU": 1})
    queue(sim, "b", 2, {"GPU": 1})
    waiting, _ = backlog(sim.state)
    assert waiting == [{"options": [{"GPU": 10_000}], "count": 5, "restricted": False}]


def test_why_names_another_shares_reservation() -> None:
    sim = cluster("a", "b")
    sim.add_worker("w", nthreads=4, resources={"GPU": 2})
    queue(sim, "a", 1, {"GPU": 1})
    sim.place()
    sim.submit("big", resources={"GPU": 2}, client="b")  # reserves w: b holds nothing
    sim.submit("a-small", resources={"GPU": 1}, client="a")
    sim.place()
    assert sim.state.workers["w1"].reserved_by == "big"
    text = explain(sim.state, "a-small")
    assert "reserved for task 'big' of share 'b'" in text, text


@pytest.mark.parametrize("other_share_waits", [False, True], ids=["one share", "two shares"])
def test_a_task_that_takes_over_a_reservation_it_then_fits_starts(
    other_share_waits: bool,
) -> None:
    # y (GPU=2) holds w2, where one GPU is free; x2 (GPU=1), older, finds w1 full
    # and takes w2's reservation over from y. What kept it out was only that
    # reservation: it starts in the same pass, not a pass later with its GPU idle.
    sim = cluster("a", "b")
    one = sim.add_worker(nthreads=2, resources={"GPU": 1})
    two = sim.add_worker(nthreads=2, resources={"GPU": 2})
    sim.submit("r1", resources={"GPU": 1}, client="a")
    sim.submit("r2", resources={"GPU": 1}, client="a")
    sim.submit("r3", resources={"GPU": 1}, client="a")
    sim.place()
    for key in ("x1", "x2"):
        sim.submit(key, resources={"GPU": 1}, client="a")
    sim.submit("y", resources={"GPU": 2}, client="a")
    sim.place()
    workers = sim.state.workers
    assert (workers[one].reserved_by, workers[two].reserved_by) == ("x1", "y")
    sim.finish(min(sim.running[one]))
    sim.finish(min(sim.running[two]))
    if other_share_waits:
        sim.submit("b-0", client="b")  # a plain task: the pass serves shares fairly
    started = dict((key, worker) for worker, key in sim.place())
    assert started["x1"] == one
    assert started["x2"] == two
    assert sim.state.tasks["y"].state == QUEUED
    check_invariants(sim.state)


def test_a_share_kept_out_by_a_reservation_gets_in_once_the_holder_takes_more() -> None:
    # a and c both hold nothing: a's reservation on w keeps c's task out of its free
    # GPU (c is not further below its fair share). Then a's plain task starts, a
    # holds a thread, and c is further below: it uses the GPU in the same pass.
    sim = cluster("a", "b", "c")
    w = sim.add_worker(nthreads=3, resources={"GPU": 3})
    sim.add_worker(nthreads=1)
    sim.submit("b-0", resources={"GPU": 2}, client="b")
    sim.place()
    sim.submit("a-gpu", resources={"GPU": 2}, client="a")
    sim.place()
    assert sim.state.workers[w].reserved_by == "a-gpu"
    sim.submit("a-plain", client="a")
    sim.submit("c-0", resources={"GPU": 1}, client="c")
    started = dict((key, worker) for worker, key in sim.place())
    assert set(started) == {"a-plain", "c-0"}
    assert started["c-0"] == w
    assert sim.state.workers[w].reserved_by == "a-gpu"
    check_invariants(sim.state)


def test_a_task_kept_out_by_a_reservation_its_holders_quota_gives_up_starts() -> None:
    # b's second task is tried while a's GPU=2 task holds the worker's free GPU; then
    # a's plain tasks take a to its quota of threads, and a's task gives its
    # reservation up (over quota, it keeps nothing): b's task starts in that pass.
    sim = cluster("b", "a")
    sim.state.shares.set("a", quota={"threads": 2 * 10_000})
    w = sim.add_worker(nthreads=4, resources={"GPU": 2})
    queue(sim, "b", 2, {"GPU": 1})
    queue(sim, "a", 2)
    sim.submit("a-gpu", resources={"GPU": 2}, client="a")
    started = dict((key, worker) for worker, key in sim.place())
    assert started == {"b-0": w, "b-1": w, "a-0": w, "a-1": w}
    assert sim.state.workers[w].reserved_by is None
    check_invariants(sim.state)
