"""Where the services read the time and sleep: one ``Clock`` each, injected.

The scheduler's tick, the worker's heartbeats, drain deadlines and reconnection
backoff all ask their clock rather than ``time`` and ``asyncio.sleep``, so tests can
run them on ``apportion.testing.FakeClock`` and let minutes pass in an instant.
I/O timeouts (a handshake, a connection attempt) stay on the event loop's own time:
they guard against a silent peer, not the logic under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals, wall time for records, and sleeping on the former."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start; never goes back."""
        ...

    def time(self) -> float:
        """Seconds since the epoch, for timestamps people read."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` of this clock's monotonic time have passed."""
        ...


class SystemClock:
    """The real clocks of this machine; every service's default."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


async def wait_event(event: asyncio.Event, timeout: float, clock: Clock) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds of ``clock`` pass; True if set."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    timer = asyncio.ensure_future(clock.sleep(timeout))
    try:
        await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, timer):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return event.is_set()
