"""The event loop's lag: how late a periodic wake-up comes, the last and the peak."""

from __future__ import annotations

import asyncio
import time

import pytest

from apportion.clock import SYSTEM_CLOCK
from apportion.loop_lag import LoopLag


class ScriptedClock:
    """Each sleep returns the given seconds late; after the last, it never returns."""

    def __init__(self, lateness: list[float]) -> None:
        self.now = 100.0
        self.lateness = lateness
        self.exhausted = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if not self.lateness:
            self.exhausted.set()
            await asyncio.Event().wait()
        self.now += seconds + self.lateness.pop(0)
        await asyncio.sleep(0)


def test_the_last_lateness_is_kept_and_the_peak_over_the_window() -> None:
    asyncio.run(_lateness_kept())


async def _lateness_kept() -> None:
    clock = ScriptedClock([0.0, 2.0, 0.1, 0.3, -0.001])
    lag = LoopLag(clock, interval=0.5, window=3)
    assert (lag.last, lag.peak) == (0.0, 0.0)
    lag.start()
    await clock.exhausted.wait()
    lag.stop()
    assert lag.last == 0.0  # woke a hair early: no lag
    assert lag.peak == pytest.approx(0.3)  # 2.0 has left the window of three
    clock.lateness = [1.0]
    clock.exhausted.clear()
    lag.start()
    await clock.exhausted.wait()
    lag.stop()
    assert (lag.last, lag.peak) == (pytest.approx(1.0), pytest.approx(1.0))


class WatchedClock:
    """The system clock, telling the test when the monitor goes to sleep again."""

    def __init__(self) -> None:
        self.sleeps = 0
        self.slept_again = asyncio.Event()
        self.monotonic = SYSTEM_CLOCK.monotonic
        self.time = SYSTEM_CLOCK.time

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps == 2:  # the first wake-up has been measured
            self.slept_again.set()
        await asyncio.sleep(seconds)


def test_a_callback_that_blocks_the_loop_shows_as_lag() -> None:
    asyncio.run(_blocked())


async def _blocked() -> None:
    clock = WatchedClock()
    lag = LoopLag(clock, interval=0.01)
    lag.start()
    await asyncio.sleep(0)  # the monitor is asleep now
    asyncio.get_running_loop().call_soon(time.sleep, 0.1)  # holds the loop
    await clock.slept_again.wait()
    lag.stop()
    assert lag.last >= 0.1 - 0.01
