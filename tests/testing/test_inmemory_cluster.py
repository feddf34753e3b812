"""The in-memory cluster of ``apportion.testing``: real services, no socket, full clean-up."""

from __future__ import annotations

import asyncio
import operator
import threading

import pytest

from apportion import task_resources
from apportion.net.memory import MEMORY
from apportion.testing import FakeClock, InMemoryCluster


def _gpus() -> float:
    return task_resources()["GPU"]


def _threads() -> set[threading.Thread]:
    return set(threading.enumerate())


def _all_ended(before: set[threading.Thread]) -> bool:
    """Threads started since ``before`` have ended (task threads finish their last get)."""
    for thread in _threads() - before:
        thread.join(timeout=5)
    return not [t for t in _threads() - before if t.is_alive()]


def test_a_synchronous_client_runs_tasks_with_resources_on_it() -> None:
    before = _threads()
    workers = [{"name": "gpu", "nthreads": 2, "resources": "GPU=2"}, {"name": "cpu"}]
    with InMemoryCluster(workers) as cluster:
        assert cluster.address.startswith("inproc://")
        assert all(w.address.startswith("inproc://") for w in cluster.workers)
        client = cluster.client()
        assert client.submit(operator.add, 1, 2).result(timeout=10) == 3
        assert client.submit(_gpus, resources={"GPU": 1}).result(timeout=10) == 1.0
        data = client.scatter([1, 2, 3])
        assert client.gather(client.submit(sum, data)) == 6
    assert cluster.address not in MEMORY.names()
    assert _all_ended(before)  # loop threads and task threads are gone


def test_a_failing_test_body_still_cleans_up() -> None:
    before = _threads()
    with pytest.raises(ZeroDivisionError), InMemoryCluster(2) as cluster:
        cluster.client()
        _ = 1 / 0
    assert cluster.address not in MEMORY.names() and _all_ended(before)


def test_the_fake_clock_drives_a_cluster_from_a_synchronous_test() -> None:
    clock = FakeClock()
    with InMemoryCluster(1, clock=clock) as cluster:
        start = clock.monotonic()
        cluster.run(clock.advance(30))
        assert clock.monotonic() == start + 30
        # The worker's heartbeats went on in fake time, and kept it alive.
        (worker,) = cluster.scheduler.state.workers.values()
        assert worker.last_seen >= start + 25


def test_on_the_tests_own_loop_with_a_client_from_a_thread() -> None:
    async def main() -> None:
        async with InMemoryCluster(1, clock=FakeClock()) as cluster:
            with pytest.raises(RuntimeError, match="blocks the running event loop"):
                cluster.client()
            with pytest.raises(RuntimeError, match="under async, await"):
                cluster.run(asyncio.sleep(0))
            client = await asyncio.to_thread(cluster.client)
            future = await asyncio.to_thread(client.submit, operator.mul, 6, 7)
            assert await asyncio.to_thread(future.result, 10) == 42
            await asyncio.to_thread(client.close)
            extra = await cluster.add_worker(name="extra")
            assert len(cluster.scheduler.state.workers) == 2
            await cluster.remove_worker(extra)
            assert cluster.workers and extra not in cluster.workers

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_closing_logs_the_workers_as_departed_not_lost(caplog: pytest.LogCaptureFixture) -> None:
    # The last worker's goodbye was still on its way when the scheduler closed, which
    # then logged that worker as lost.
    with caplog.at_level("INFO", logger="apportion"), InMemoryCluster(3) as cluster:
        client = cluster.client()
        assert client.gather(client.map(operator.neg, range(30))) == [-i for i in range(30)]
    lost = [r.getMessage() for r in caplog.records if "lost worker" in r.getMessage()]
    assert lost == []
