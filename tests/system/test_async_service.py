"""An asynchronous client in a web service's shape: one event loop, many concurrent
requests each awaiting a task, worker processes doing the work.

What must hold: no thread per awaited call, and a large gather in flight leaves the
loop free to serve (its lag is printed; only what cannot flake is asserted).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time

import cloudpickle
import psutil
import pytest

from apportion import Client, wait

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.process, pytest.mark.tcp]

#: The large gather: this many results of this many bytes each (160 MB).
PARTS, PART_BYTES = 8, 20_000_000


def answer(i: int) -> int:
    return i * i


def zeros(i: int, size: int) -> bytes:
    return bytes(size)


class Ticker:
    """How late each ``asyncio.sleep(0.005)`` of the loop wakes: its lag."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(0.005)
            self.lags.append(loop.time() - start - 0.005)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest.mark.timeout(120)
def test_a_service_awaits_many_tasks_without_threads_and_without_stalling() -> None:
    before = set(threading.enumerate())
    children = {p.pid for p in psutil.Process().children(recursive=True)}

    async def service() -> None:
        async with Client(asynchronous=True, n_workers=1, threads_per_worker=2) as client:
            await client.wait_for_workers(1)

            async def handler(i: int) -> int:
                return await client.submit(answer, i, pure=False)

            idle = threading.active_count()
            peak = idle

            async def count_threads() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, threading.active_count())
                    await asyncio.sleep(0.001)

            counter = asyncio.create_task(count_threads())
            results = await asyncio.gather(*(handler(i) for i in range(100)))
            counter.cancel()
            assert results == [i * i for i in range(100)]
            # Bounded: no thread per call (the client's own ones only, with a little
            # slack for the client's done-callback thread starting meanwhile).
            assert peak <= idle + 1, (idle, peak)

            parts = client.map(zeros, range(PARTS), size=PART_BYTES)
            await wait(parts)
            ticker = Ticker()
            ticker.start()
            await asyncio.sleep(0.05)
            first = len(ticker.lags)
            started = time.perf_counter()
            values = await client.gather(parts)
            took = time.perf_counter() - started
            during = ticker.lags[first:]
            await ticker.stop()
            assert sum(map(len, values)) == PARTS * PART_BYTES
            del values
            worst = max(during, default=0.0)
            p99 = statistics.quantiles(during, n=100, method="inclusive")[-1] if during else 0.0
            print(
                f"\ngather of {PARTS * PART_BYTES / 1e6:.0f} MB took {took * 1e3:.0f} ms; "
                f"the loop ticked {len(during)} times meanwhile, lag max "
                f"{worst * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"
            )
            # The loop kept running while the gather was in flight: many ticks, and
            # no stall anywhere near the gather's own length.
            assert len(during) >= 3
            assert worst < max(0.5 * took, 0.05)

    asyncio.run(service())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        alive = {p.pid for p in psutil.Process().children(recursive=True)} - children
        if not left and not alive:
            break
        time.sleep(0.05)
    assert not left, [t.name for t in left]
    assert not alive, "worker processes left behind"
