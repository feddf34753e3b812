"""Two clients share a ``LocalCluster``'s GPUs: the second's one task does not wait
for the first's whole queue (``scheduler/shares.py``).

One worker process with ``GPU=2``; client A queues 30 tasks of 0.2 s asking
``GPU=1`` (3 s of work), then client B submits one. B's task starts at the next
freed GPU, about 0.2 s later, where first come, first served made it wait until
A's queue was empty. Checked on what happened: each task reports its wall-clock
span (one machine, one clock).
"""

from __future__ import annotations

import sys
import threading
import time

import cloudpickle
import pytest

from apportion import Client, LocalCluster

pytestmark = [pytest.mark.process, pytest.mark.tcp]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TASKS = 30
SECONDS = 0.2


def timed_sleep(seconds: float, _: int) -> tuple[float, float]:
    start = time.time()
    threading.Event().wait(seconds)
    return start, time.time()


@pytest.mark.timeout(60)
def test_a_second_client_is_served_at_the_next_freed_gpu() -> None:
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=4,
            resources={"GPU": 2},
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as a,
        Client(cluster) as b,
    ):
        spans = a.map(timed_sleep, [SECONDS] * TASKS, range(TASKS), resources={"GPU": 1})
        deadline = time.monotonic() + 20
        while sum(len(keys) for keys in a.processing().values()) < 2:
            assert time.monotonic() < deadline, "A's first tasks never started"
            time.sleep(0.01)
        # A's first two tasks are running, the rest wait.
        submitted = time.time()
        start, _ = b.submit(timed_sleep, SECONDS, -1, resources={"GPU": 1}).result(timeout=30)
        a_spans = a.gather(spans)
        last_end = max(end for _, end in a_spans)
        # At the next freed GPU (0.2 s), with room for a loaded 2-core machine; A's
        # queue keeps the cluster busy until about 3 s.
        assert start - submitted < 1.0, f"B waited {start - submitted:.2f} s"
        assert start < last_end - 1.5, "B's task ran only once A's queue emptied"
        # Never more than the two GPUs at once, whoever's.
        spans_all = [*a_spans, (start, start + SECONDS)]
        for t, _ in spans_all:
            assert sum(1 for s, e in spans_all if s <= t < e) <= 2
