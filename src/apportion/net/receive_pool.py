"""Memory for large received buffers, reused while its pages are still in place.

A received array lives in the buffer it was received into. Fresh memory costs a page
fault and a page of zeros per page the first time it is written, and on a virtual
machine the host may have to back each page too: measured on ours, filling fresh
memory ran at 0.5 GiB/s against 5.7 GiB/s for memory written before, so a transfer
of 64 MiB took 140 ms instead of 11. Memory the host backed once (in a process
that ran a while) costs less: ``benchmarks/data_transfer.py`` moved 16 MiB arrays
worker to worker at 2.7 GiB/s into fresh memory, at 3.2 into reused memory, and
gathered them at 3.0 against 4.3. Freed the usual way, a large buffer is unmapped at
once, and the next transfer of the same size starts from fresh memory again.

So a buffer of ``POOL_FROM`` bytes or more is a memory map of its own, handed out
through a ``ctypes`` array over it. When the last value using it is gone, the array's
finalizer puts the map back here, and the next buffer of about the same size reuses
it, its pages in place.

Unused maps are memory the process holds for nothing but speed, so the pool keeps
them only while that speed is likely wanted:

- at most ``limit`` bytes of them (a worker with a memory limit lowers it to a
  quarter of its fetch budget, ``memory_policy.RECEIVE_POOL_FRACTION``);
- for ``idle_for`` seconds at most: ``release_idle`` unmaps those unused longer (a
  worker calls it every heartbeat, and every tick of its memory monitor), so a
  worker that stopped receiving gives the memory back within a few seconds, while
  transfers that follow one another reuse it. The most recently returned map of a
  size is handed out first, so that the others can age out;
- none before spilling: ``clear`` unmaps them all (a worker about to spill does).

Thread-safe: the last use of a value may end in any thread.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
import weakref
from collections.abc import Callable

#: Buffers from this size up come from the pool; smaller ones are ``bytearray``s.
POOL_FROM = 1 << 20
#: Maps are sized in steps of this (a huge page), so that sizes close to each other
#: share them.
STEP = 2 << 20
#: A free map is reused for a buffer down to this fraction of its size, no smaller.
FIT = 0.75
#: Default bytes of unused maps kept.
DEFAULT_LIMIT = 512 << 20
#: Seconds an unused map is kept by default: back-to-back transfers (the inputs of a
#: graph's next tasks, the next round of a loop) come sooner than this.
IDLE_FOR = 2.0
#: Linux's advice that a mapping be backed by huge pages where it can (None elsewhere):
#: a 2 MiB page faults in once where 4 KiB pages would fault 512 times.
HUGE_PAGES: int | None = getattr(mmap, "MADV_HUGEPAGE", None)


class ReceivePool:
    """Unused memory maps by size, to receive large buffers into."""

    def __init__(
        self,
        limit: int = DEFAULT_LIMIT,
        *,
        idle_for: float = IDLE_FOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        #: Seconds an unused map is kept before ``release_idle`` unmaps it.
        self.idle_for = idle_for
        #: When each map was returned is read from this (seconds, any origin): a test
        #: passes one it moves itself.
        self._clock = clock
        #: Unused maps by size, each with the time it was returned, oldest first.
        self._free: dict[int, list[tuple[float, mmap.mmap]]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        #: Buffers handed out so far that reused a map (for tests and benchmarks).
        self.reused = 0

    @property
    def free_bytes(self) -> int:
        """Bytes of unused maps held."""
        return self._bytes

    def take(self, size: int) -> memoryview:
        """``size`` writable bytes whose memory returns here once nothing uses it."""
        capacity = -(-size // STEP) * STEP
        mapped = self._reuse(size, capacity)
        if mapped is None:
            mapped = mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if HUGE_PAGES is not None:
                mapped.madvise(HUGE_PAGES)
        window = (ctypes.c_char * size).from_buffer(mapped)
        weakref.finalize(window, self._give_back, mapped)
        return memoryview(window).cast("B")

    def _reuse(self, size: int, capacity: int) -> mmap.mmap | None:
        with self._lock:
            for have in sorted(self._free):
                if have >= capacity and size >= have * FIT:
                    maps = self._free[have]
                    _, mapped = maps.pop()  # the newest: the others may age out
                    if not maps:
                        del self._free[have]
                    self._bytes -= have
                    self.reused += 1
                    return mapped
        return None

    def _give_back(self, mapped: mmap.mmap) -> None:
        # Runs as the last window over ``mapped`` dies, before it lets go of the map:
        # a map not kept is unmapped once the window is gone, when nothing refers to it.
        size = len(mapped)
        now = self._clock()
        with self._lock:
            if self._bytes + size <= self.limit:
                self._free.setdefault(size, []).append((now, mapped))
                self._bytes += size

    def release_idle(self) -> int:
        """Unmap the maps unused for ``idle_for`` seconds or more; the bytes let go."""
        before = self._clock() - self.idle_for
        idle: list[tuple[float, mmap.mmap]] = []
        with self._lock:
            for size in list(self._free):
                maps = self._free[size]
                old = 0
                while old < len(maps) and maps[old][0] <= before:
                    old += 1
                if old:
                    idle += maps[:old]
                    del maps[:old]
                    self._bytes -= old * size
                    if not maps:
                        del self._free[size]
        # Unmapped as ``idle`` goes, outside the lock: a receiving thread need not wait.
        return sum(len(mapped) for _, mapped in idle)

    def cap(self, limit: int) -> None:
        """Keep no more than ``limit`` bytes of unused maps from now on (the lowest
        cap holds, as workers of one process share the pool)."""
        self.limit = min(self.limit, limit)
        if self._bytes > self.limit:
            self.clear()

    def clear(self) -> None:
        """Unmap every unused map."""
        with self._lock:
            self._free, self._bytes = {}, 0  # unmapped as their last reference goes


#: This process's pool: every connection receives its large buffers from it.
POOL = ReceivePool()
