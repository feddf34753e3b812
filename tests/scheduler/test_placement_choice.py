"""Which worker a resource task goes to, checked against a plain model.

Placement takes the least loaded fitting worker from a heap per pool and pass, and
drops from its view the workers that cannot take a pool's amounts for the rest of
the pass (``placement._PassPools``); the choice must be the one a walk over every
worker makes: least loaded (tasks running over threads), ties to the first to join.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import RecordingCluster

pytestmark = pytest.mark.timeout(60)

#: Each worker's threads and GPUs; then how many plain tasks run before the GPU work.
workers = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3)), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(shape=workers, n_busy=st.integers(0, 12), n_tasks=st.integers(1, 14))
def test_each_gpu_task_goes_to_the_least_loaded_worker_it_fits(
    shape: list[tuple[int, int]], n_busy: int, n_tasks: int
) -> None:
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    ids = [
        sim.add_worker(f"n{i}", nthreads=threads, resources=f"GPU={gpus}" if gpus else None)
        for i, (threads, gpus) in enumerate(shape)
    ]
    for b in range(n_busy):
        sim.submit(f"busy-{b}")
    sim.place()  # spread by the plain pass: uneven loads
    records = [sim.state.workers[w] for w in ids]
    running = [w.running() for w in records]
    threads = [w.nthreads for w in records]
    gpus = [gpus for _, gpus in shape]
    for t in range(n_tasks):
        sim.submit(f"gpu-{t}", resources="GPU=1")
    started = [(w, k) for w, k in sim.place() if k.startswith("gpu-")]
    expected = []
    for t in range(n_tasks):
        fitting = [i for i in range(len(ids)) if running[i] < threads[i] and gpus[i] > 0]
        if not fitting:
            break
        best = min(fitting, key=lambda i: (running[i] / threads[i], i))
        running[best] += 1
        gpus[best] -= 1
        expected.append((ids[best], f"gpu-{t}"))
    assert started == expected
    check_invariants(sim.state)


@settings(max_examples=150, deadline=None)
@given(
    shape=workers,
    n_gpu=st.integers(0, 6),
    n_plain=st.integers(1, 40),
    n_long=st.integers(0, 4),
)
def test_plain_tasks_wait_only_when_no_open_worker_has_room(
    shape: list[tuple[int, int]], n_gpu: int, n_plain: int, n_long: int
) -> None:
    """The plain pass stops at its oldest task only when every open worker is full for it,
    whatever the mix of thread counts and of workers kept to their free threads
    (those offering resources while resource work waits): a full worker that is the
    least busy per thread ends the walk only when no other may hold more per thread."""
    from apportion.scheduler.placement import (
        _has_room,
        ahead_per_thread,
        closed_to_plain,
        resource_work_waiting,
    )

    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    for i, (threads, gpus) in enumerate(shape):
        sim.add_worker(f"n{i}", nthreads=threads, resources=f"GPU={gpus}" if gpus else None)
    sim.submit("short-0")
    sim.place()
    sim.finish("short-0", duration=0.0005)  # short: queued ahead, four per thread
    for i in range(n_long):
        sim.submit(f"long-{i}")  # not measured yet: never queued ahead
    for i in range(n_gpu):
        sim.submit(f"gpu-{i}", resources="GPU=1")
    for i in range(1, n_plain + 1):
        sim.submit(f"short-{i}")
    sim.place()
    check_invariants(sim.state)
    state = sim.state
    waiting = resource_work_waiting(state)
    plain = [f"long-{i}" for i in range(n_long)] + [f"short-{i}" for i in range(1, n_plain + 1)]
    queued = [key for key in plain if state.tasks[key].worker is None]
    if not queued:
        return
    head = state.tasks[queued[0]]  # the oldest waiting: the younger wait behind it
    ahead = ahead_per_thread(state, state.expected(head))
    open_workers = [w for w in state.workers.values() if not closed_to_plain(state, w, waiting)]
    assert not [w.name for w in open_workers if _has_room(state, w, ahead, waiting)], head.key
