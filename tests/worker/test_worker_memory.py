"""A worker's memory management through the real services, in memory: the process's
memory is faked (no test allocates what it checks), time is a ``FakeClock``, the
spill directory is the test's own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apportion import OutOfMemoryError
from apportion.core.allocation import Allocation
from apportion.core.payload import dumps, function_id, pack_call
from apportion.net.receive_pool import ReceivePool
from apportion.protocol.worker import ComputeTask, Heartbeat, LoadFunction, TaskFinished
from apportion.testing import FakeClock, FakeMemory, InMemoryCluster
from apportion.worker import memory_manager, service
from apportion.worker.memory_manager import MemoryConfig
from apportion.worker.service import Worker
from apportion.worker.spill import SpillStore
from fake_scheduler import FakeScheduler

pytestmark = pytest.mark.timeout(30)

MiB = 2**20
LIMIT = 100 * MiB  # target 60, spill 70, pause 80 MiB


def limited(memory: FakeMemory, tmp_path: Path, **options: Any) -> dict[str, Any]:
    config = MemoryConfig(local_directory=str(tmp_path), measure=memory)
    return {"name": "w", "memory_limit": LIMIT, "memory": config, **options}


def store_of(cluster: InMemoryCluster) -> SpillStore:
    store = cluster.workers[0].memory_manager.store
    assert store is not None
    return store


def total(*arrays: np.ndarray) -> float:
    return float(sum(a.sum() for a in arrays))


def test_over_the_spill_threshold_results_move_to_disk_and_still_feed_tasks(
    tmp_path: Path,
) -> None:
    clock, memory = FakeClock(), FakeMemory(10 * MiB)
    with InMemoryCluster([limited(memory, tmp_path)], clock=clock) as cluster:
        client = cluster.client()
        parts = [client.submit(np.full, 1000, i, dtype="float64") for i in range(5)]
        client.gather(parts)
        store = store_of(cluster)
        assert store.spilled_count == 0  # 40 kB is far under the target
        memory.rss = 75 * MiB  # above spill: down to target, all 40 kB of results
        cluster.run(clock.advance(0.1))
        assert store.spilled_count == 5 and store.memory_bytes == 0
        assert len(list((store.directory).iterdir())) == 5
        cluster.run(clock.advance(1.0))  # a heartbeat tells the scheduler
        (record,) = cluster.scheduler.state.workers.values()
        assert record.spilled == 5 * 8000 and not record.paused
        memory.rss = 10 * MiB  # as spilling does: back under, room for results again
        cluster.run(clock.advance(0.1))
        # A task reading spilled inputs gets their values, read back from disk.
        assert client.submit(total, *parts).result(timeout=10) == 1000 * sum(range(5))
        assert store.spilled_count == 0 and list(store.directory.iterdir()) == []
        assert [p.result(timeout=10)[0] for p in parts] == [0, 1, 2, 3, 4]
    assert list(tmp_path.iterdir()) == []  # the worker's directory went with it


def test_managed_memory_above_target_spills_as_results_arrive(tmp_path: Path) -> None:
    clock, memory = FakeClock(), FakeMemory(10 * MiB)
    small = {"memory_limit": 100_000}  # target: 60 kB, so 7 results of 8 kB
    with InMemoryCluster([{**limited(memory, tmp_path), **small}], clock=clock) as cluster:
        client = cluster.client()
        parts = client.map(np.full, [1000] * 20, range(20), pure=False)
        assert [a[0] for a in client.gather(parts)] == list(range(20))
        store = store_of(cluster)
        assert store.memory_bytes <= 60_000 and store.spilled_count >= 13


def test_memory_outside_the_store_leaves_writes_only_the_room_under_spill(
    tmp_path: Path,
) -> None:
    clock, memory = FakeClock(), FakeMemory(66 * MiB)  # a task's temporaries, say
    with InMemoryCluster([limited(memory, tmp_path)], clock=clock) as cluster:
        client = cluster.client()
        cluster.run(clock.advance(0.1))
        store = store_of(cluster)
        assert store.target == 4 * MiB  # 70 MiB spill - 66 MiB outside the store
        first = client.map(np.ones, [3 * MiB // 8] * 3, pure=False)
        client.gather(first)
        assert store.memory_bytes == 3 * MiB and store.spilled_count == 2
        memory.rss = 10 * MiB  # the temporaries are gone: the whole target is back
        cluster.run(clock.advance(0.1))
        assert store.target == 60 * MiB
        second = client.map(np.ones, [3 * MiB // 8] * 3, pure=False)
        client.gather(second)
        assert store.memory_bytes == 12 * MiB and store.spilled_count == 2


def test_above_pause_the_worker_takes_no_new_task_until_memory_falls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock, memory = FakeClock(), FakeMemory(10 * MiB)
    caplog.set_level(logging.WARNING, "apportion.worker")
    with InMemoryCluster([limited(memory, tmp_path)], clock=clock) as cluster:
        client = cluster.client()
        memory.rss = 85 * MiB  # nothing to spill: it stays above pause
        cluster.run(clock.advance(0.5))
        worker = cluster.workers[0]
        (record,) = cluster.scheduler.state.workers.values()
        assert worker.state.paused and record.paused  # told at once, not at a heartbeat
        future = client.submit(sum, [1, 2])
        cluster.run(clock.advance(2.0))
        assert future.status == "pending" and not worker.state.tasks
        memory.rss = 79 * MiB
        cluster.run(clock.advance(0.1))
        assert not worker.state.paused
        assert future.result(timeout=10) == 3
    paused = [r for r in caplog.records if "paused at 85.0 MiB" in r.getMessage()]
    resumed = [r for r in caplog.records if "resumed at 79.0 MiB" in r.getMessage()]
    assert len(paused) == 1 and len(resumed) == 1  # once each, though sampled 25 times
    assert "85% of its 100.0 MiB limit" in paused[0].getMessage()


def add(a: int, b: int) -> int:
    return a + b


def compute(key: str, func: Callable[..., Any], *args: Any) -> list[Any]:
    blob = dumps(func)
    fid = function_id(blob)
    packed, _ = pack_call(args, {})
    return [LoadFunction(fid, blob), ComputeTask(key, fid, packed, {}, 0, Allocation({}, {}))]


def test_a_task_sent_to_a_paused_worker_waits_there_for_it_to_resume(tmp_path: Path) -> None:
    """The scheduler may assign a task before it hears of the pause: the worker's
    state machine holds it back."""
    clock, memory = FakeClock(), FakeMemory(10 * MiB)

    async def scenario() -> None:
        scheduler = await FakeScheduler().start()
        options = limited(memory, tmp_path)
        try:
            async with Worker(scheduler.address, clock=clock, **options) as worker:
                conn, _ = await scheduler.next_worker()
                memory.rss = 90 * MiB
                await clock.advance(0.1)
                beat = await scheduler.expect(conn, Heartbeat)
                assert beat.paused == 1 and beat.memory == 90 * MiB
                for message in compute("x", add, 2, 3):
                    conn.send(message)
                while "x" not in worker.state.tasks:
                    await asyncio.sleep(0.001)
                await clock.advance(1.0)
                assert worker.state.ready_keys() == ["x"] and not worker.state.executing
                memory.rss = 20 * MiB
                await clock.advance(0.1)
                done = await scheduler.expect(conn, TaskFinished)
                assert done.key == "x" and worker.data["x"] == 5
                directory = worker.memory_manager.directory
                assert directory is not None and directory.path.exists()
            assert directory.removed and not directory.path.exists()
        finally:
            await scheduler.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_without_a_limit_there_is_no_store_no_directory_no_monitor(tmp_path: Path) -> None:
    plain = Worker("inproc://nowhere", memory=MemoryConfig(local_directory=str(tmp_path)))
    assert type(plain.store) is dict and plain.memory_manager.directory is None
    assert list(tmp_path.iterdir()) == []
    mine: dict[str, Any] = {}
    own = Worker("inproc://nowhere", data=mine, memory_limit=LIMIT)
    assert own.store is mine and own.memory_manager.store is None  # never spilled; pausing applies


def test_a_result_larger_than_the_worker_keeps_fails_out_of_memory_and_the_worker_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock, memory = FakeClock(), FakeMemory(10 * MiB)
    small = {"memory_limit": 100_000}  # it keeps results of up to 95,000 bytes
    with InMemoryCluster([{**limited(memory, tmp_path), **small}], clock=clock) as cluster:
        client = cluster.client()
        big = client.submit(np.ones, 200_000, dtype="uint8", key="big")
        after = client.submit(total, big)
        with (
            caplog.at_level(logging.WARNING, "apportion.worker"),
            pytest.raises(OutOfMemoryError) as caught,
        ):
            big.result(timeout=10)
        assert isinstance(caught.value, MemoryError)
        text = str(caught.value)
        assert text.startswith("out of memory: the result of 'big' (numpy.ndarray of 195.3 KiB)")
        assert "its memory limit is 97.7 KiB, and it is killed above 92.8 KiB" in text
        with pytest.raises(OutOfMemoryError):
            after.result(timeout=10)  # its dependents fail with it
        assert "big" not in cluster.workers[0].data  # dropped, never stored or spilled
        assert store_of(cluster).spilled_count == 0
        assert "is larger than the 92.8 KiB this worker keeps" in caplog.text
        assert client.submit(np.ones, 1000, dtype="uint8").result(timeout=10).sum() == 1000


def test_the_monitor_keeps_little_unused_receive_memory_and_not_for_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, memory = FakeClock(), FakeMemory(10 * MiB)
    pool = ReceivePool(clock=clock.monotonic)
    monkeypatch.setattr(memory_manager, "POOL", pool)
    with InMemoryCluster([limited(memory, tmp_path)], clock=clock) as cluster:
        assert pool.limit == int(LIMIT * 0.025)  # a quarter of the fetch budget: 2.5 MiB
        buffers = [pool.take(2 * MiB), pool.take(2 * MiB)]
        del buffers
        assert pool.free_bytes == 2 * MiB  # the second was over the cap
        cluster.run(clock.advance(1.9))  # the monitor ticks every 0.1 s
        assert pool.free_bytes == 2 * MiB  # still wanted for the next transfer
        cluster.run(clock.advance(0.2))
        assert pool.free_bytes == 0


def test_without_a_limit_heartbeats_release_unused_receive_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    pool = ReceivePool(clock=clock.monotonic)
    monkeypatch.setattr(service, "POOL", pool)
    with InMemoryCluster([{"name": "w"}], clock=clock) as cluster:
        kept = pool.take(2 * MiB)
        del kept
        cluster.run(clock.advance(1.0))  # a heartbeat: not idle long enough yet
        assert pool.free_bytes == 2 * MiB
        cluster.run(clock.advance(2.0))  # the next heartbeat after two seconds idle
        assert pool.free_bytes == 0
