"""How late an event loop wakes up: the lag ``/metrics`` reports for the scheduler.

Anything that holds the loop (a long callback, a large message decoded in one go)
delays every connection at once, and seen from outside looks like a slow network
or a slow worker. A task that sleeps a fixed interval again and again measures it
directly: whatever it wakes up later than asked is time the loop was busy.

The lateness is measured with the clock it sleeps on; that is the real clock by
default, whatever clock the service paces itself with, because it is the real
loop's lag that matters (on a test's fake clock it would measure nothing).
"""

from __future__ import annotations

import asyncio
from collections import deque

from apportion.clock import SYSTEM_CLOCK, Clock

#: Seconds between wake-ups.
INTERVAL = 0.5
#: Wake-ups the peak is taken over: 30 s at INTERVAL, longer when the loop is late.
WINDOW = 60


class LoopLag:
    """Sleeps ``interval`` on ``clock`` over and over on the running loop, keeping how
    late each of the last ``window`` wake-ups came; ``start`` and ``stop`` it."""

    def __init__(
        self, clock: Clock = SYSTEM_CLOCK, interval: float = INTERVAL, window: int = WINDOW
    ) -> None:
        self.clock = clock
        self.interval = interval
        #: Seconds late of the last ``window`` wake-ups, oldest first (each >= 0).
        self._recent: deque[float] = deque(maxlen=window)
        self._task: asyncio.Task[None] | None = None

    @property
    def last(self) -> float:
        """Seconds late at the last wake-up (0 before the first)."""
        return self._recent[-1] if self._recent else 0.0

    @property
    def peak(self) -> float:
        """The most it woke up late over the recent wake-ups (0 before the first)."""
        return max(self._recent, default=0.0)

    def start(self) -> None:
        """Begin measuring on the running loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._measure(), name="loop-lag")

    def stop(self) -> None:
        """Stop measuring; what was measured stays readable."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _measure(self) -> None:
        clock, interval = self.clock, self.interval
        while True:
            before = clock.monotonic()
            await clock.sleep(interval)
            # A sleep may return a hair early: that is no lag, and never a negative one.
            self._recent.append(max(0.0, clock.monotonic() - before - interval))
