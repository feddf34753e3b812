"""The fake clock: sleepers wake in deadline order, each at its own time, on their loops."""

from __future__ import annotations

import asyncio

import pytest

from apportion.clock import SYSTEM_CLOCK, wait_event
from apportion.loop_thread import LoopThread
from apportion.testing import FakeClock


def test_sleepers_wake_in_deadline_order_each_seeing_its_own_time() -> None:
    async def main() -> None:
        clock = FakeClock(start=0.0, wall=100.0)
        seen: list[tuple[str, float]] = []

        async def sleeper(name: str, every: float, times: int) -> None:
            for _ in range(times):
                await clock.sleep(every)
                seen.append((name, clock.monotonic()))

        tasks = [
            asyncio.create_task(sleeper("a", 1.0, 3)),
            asyncio.create_task(sleeper("b", 1.5, 2)),
        ]
        await asyncio.sleep(0)
        assert clock.sleepers == 2 and clock.next_deadline() == 1.0
        await clock.advance(2.9)
        assert seen == [("a", 1.0), ("b", 1.5), ("a", 2.0)]
        assert clock.monotonic() == 2.9 and clock.time() == 102.9
        await clock.advance(0.1)
        assert seen[3:] == [("b", 3.0), ("a", 3.0)] or seen[3:] == [("a", 3.0), ("b", 3.0)]
        await asyncio.gather(*tasks)
        with pytest.raises(ValueError, match="cannot go back"):
            await clock.advance(-1)

    asyncio.run(main())


def test_a_cancelled_sleep_is_skipped_and_zero_returns_at_once() -> None:
    async def main() -> None:
        clock = FakeClock()
        task = asyncio.create_task(clock.sleep(5))
        await asyncio.sleep(0)
        task.cancel()
        await clock.sleep(0)
        assert clock.sleepers == 0 and clock.next_deadline() is None
        await clock.advance(10)

    asyncio.run(main())


def test_sleepers_on_another_loop_are_woken_there() -> None:
    clock = FakeClock()
    other = LoopThread("fake-clock-test")
    try:
        future = asyncio.run_coroutine_threadsafe(clock.sleep(3), other.loop)

        async def advance() -> None:
            while clock.sleepers == 0:
                await asyncio.sleep(0.001)  # the other thread registers its sleep
            await clock.advance(3)

        asyncio.run(advance())
        future.result(timeout=5)
    finally:
        other.stop()


def test_wait_event_on_either_clock() -> None:
    async def main() -> None:
        clock = FakeClock()
        event = asyncio.Event()
        waiting = asyncio.create_task(wait_event(event, 10, clock))
        while clock.sleepers == 0:
            await asyncio.sleep(0)  # the task starts and registers its sleep
        await clock.advance(9)
        assert not waiting.done()
        await clock.advance(1)
        assert await waiting is False
        event.set()
        assert await wait_event(event, 10, clock) is True
        assert await wait_event(asyncio.Event(), 0.01, SYSTEM_CLOCK) is False

    asyncio.run(main())
