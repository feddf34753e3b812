"""A clock that moves only when a test says so.

``FakeClock`` stands in for ``SystemClock`` in a ``Scheduler``, a ``Worker`` or an
``InMemoryCluster``: their sleeps wait on it, and ``await clock.advance(30)`` lets
thirty seconds pass at once. Sleepers are woken in the order of their deadlines,
each with the clock reading its own deadline, and the event loop runs between two
wake-ups, so a heartbeat due at 1.0 is sent (and handled) before a tick due at 1.5
looks for it: the same order every run.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading

#: Loop turns given to woken sleepers (and what they set off) before the next wake-up.
#: A message across the in-memory transport takes a few turns; this leaves a margin.
SETTLE_TURNS = 50


class FakeClock:
    """Monotonic and wall time that stand still until ``advance``.

    Sleepers may wait from any event loop; ``advance`` wakes them on their own loops.
    """

    def __init__(self, start: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self._now = start
        #: Wall time minus monotonic time: constant, as on a machine whose clock is right.
        self._wall_offset = wall - start
        #: (deadline, order of arrival, waiter); cancelled waiters are skipped when due.
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced past ``seconds`` from now."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), waiter))
        await waiter

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting now."""
        with self._lock:
            return sum(1 for _, _, waiter in self._sleepers if not waiter.done())

    def next_deadline(self) -> float | None:
        """When the earliest waiting sleep is due, if any."""
        with self._lock:
            live = [deadline for deadline, _, waiter in self._sleepers if not waiter.done()]
        return min(live, default=None)

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: wake every sleep due meanwhile, in deadline order."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} seconds)")
        target = self._now + seconds
        while (due := self._pop_due(target)) is not None:
            deadline, waiters = due
            self._now = max(self._now, deadline)
            for waiter in waiters:
                _wake(waiter)
            await _settle()
        self._now = target
        await _settle()

    def _pop_due(self, target: float) -> tuple[float, list[asyncio.Future[None]]] | None:
        """The earliest deadline up to ``target`` and every live sleeper due then."""
        with self._lock:
            while self._sleepers and self._sleepers[0][2].done():
                heapq.heappop(self._sleepers)  # cancelled meanwhile
            if not self._sleepers or self._sleepers[0][0] > target:
                return None
            deadline = self._sleepers[0][0]
            waiters = []
            while self._sleepers and self._sleepers[0][0] == deadline:
                waiters.append(heapq.heappop(self._sleepers)[2])
            return deadline, waiters


def _wake(waiter: asyncio.Future[None]) -> None:
    """Resolve ``waiter`` on its own loop (it may be another thread's)."""

    def resolve() -> None:
        if not waiter.done():
            waiter.set_result(None)

    loop = waiter.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        resolve()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(resolve)


async def _settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
