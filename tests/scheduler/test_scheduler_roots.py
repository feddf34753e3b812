"""Roots: tasks with no inputs that feed others, the ones that make a graph's data.

They go to a worker only while it has fewer than ``ceil(threads x root_saturation)``
tasks, preferably where their siblings (the other inputs of the task they feed) were
given; a group measured to make tiny results is queued ahead as any short work.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.scheduler.explain import explain
from apportion.scheduler.invariants import check_invariants
from apportion.testing import SimulatedCluster

CHUNK = 32 << 20  # a 2,000 x 2,000 block of float64


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster()
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def _on(sim: SimulatedCluster, worker: str) -> list[str]:
    return sorted(sim.running[worker])


def _reduction(sim: SimulatedCluster, n: int, fan_in: int = 2) -> None:
    """``n`` roots ``make-i`` and sums of ``fan_in`` of them, submitted as one graph in
    the order Dask's ``order`` gives (each sum right after its inputs)."""
    specs, sums = [], []
    for first in range(0, n, fan_in):
        group = [f"make-{i}" for i in range(first, min(n, first + fan_in))]
        specs += [TaskSpec(key, "f", b"", [], {}, 0, 0) for key in group]
        sums.append(f"sum-{first // fan_in}")
        specs.append(TaskSpec(sums[-1], "f", b"", group, {}, 0, 0))
    sim.client_says("c1", SubmitTasks(specs, {"f": b"func"}, sums))


def test_roots_fill_threads_and_a_tenth_more_not_the_pipeline(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=8)
    sim.measured("make-0", 0.001)  # short: a plain task would be queued 2 per thread ahead
    _reduction(sim, 40, fan_in=40)
    assert len(sim.place()) == 9  # ceil(8 x 1.1), not 8 x (1 + 2)
    sim.finish("make-0", nbytes=CHUNK)
    assert len(sim.place()) == 1  # one out, one in: new data only as the old is used
    assert len(sim.running[w]) == 9


def test_roots_measured_to_make_tiny_results_are_queued_ahead(sim: SimulatedCluster) -> None:
    w = sim.add_worker(nthreads=2)
    sim.measured("make-0", 0.001)
    _reduction(sim, 40, fan_in=40)
    assert len(sim.place()) == 3  # ceil(2 x 1.1): nothing measured yet
    sim.finish("make-0", nbytes=8)  # a tree of no-ops: hold-back would only cost
    sim.place()
    assert len(sim.running[w]) == 2 * (1 + 2)  # a thread each, two ahead per thread


def test_a_task_feeding_nothing_is_not_held_back(sim: SimulatedCluster) -> None:
    sim.add_worker(nthreads=2)
    sim.measured("map-0", 0.001)
    for i in range(10):
        sim.submit(f"map-{i}")  # client.map: every result goes to the client
    assert len(sim.place()) == 6


def test_a_root_goes_where_its_siblings_were_given(sim: SimulatedCluster) -> None:
    a = sim.add_worker("a")
    b = sim.add_worker("b")
    sim.measured("make-0", 0.05)
    _reduction(sim, 4)
    sim.place()
    # Least busy first would alternate: make-0 and make-2 on a, make-1 and make-3 on b,
    # and every sum would fetch a block from the other worker.
    assert _on(sim, a) == ["make-0", "make-1"]
    assert _on(sim, b) == ["make-2", "make-3"]
    for key in ("make-0", "make-1", "make-2", "make-3"):
        sim.finish(key, nbytes=CHUNK)
    sim.place()
    assert _on(sim, a) == ["sum-0"] and _on(sim, b) == ["sum-1"]  # nothing moves


def test_a_root_whose_sibling_worker_is_full_goes_to_the_least_busy(
    sim: SimulatedCluster,
) -> None:
    a = sim.add_worker("a")
    b = sim.add_worker("b")
    sim.measured("make-0", 0.05)
    _reduction(sim, 6, fan_in=3)
    sim.place()
    # a holds two (a thread and a tenth, rounded up), so the third sibling goes to b,
    # and the next group starts beside it.
    assert _on(sim, a) == ["make-0", "make-1"]
    assert _on(sim, b) == ["make-2", "make-3"]
    sim.finish("make-2", nbytes=CHUNK)
    sim.place()
    assert _on(sim, b) == ["make-3", "make-4"]  # beside make-3, though a is as busy
    sim.finish("make-0", nbytes=CHUNK)
    sim.place()
    assert _on(sim, a) == ["make-1", "make-5"]  # b is full: a's thread is not left idle


def test_why_says_a_queued_root_starts_as_threads_free_up(sim: SimulatedCluster) -> None:
    sim.add_worker(nthreads=1)
    sim.measured("make-0", 0.05)
    _reduction(sim, 4)
    sim.place()
    assert "makes new data" in explain(sim.state, "make-2")
    assert "makes new data" not in explain(sim.state, "sum-0")
