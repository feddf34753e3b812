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
