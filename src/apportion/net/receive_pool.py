"""Memory for large received buffers, reused while its pages are still in place.

A received array lives in the buffer it was received into. Fresh memory costs a page
fault and a page of zeros per page the first time it is written, and on a virtual
machine the host may have to back each page too: measured on ours, filling fresh
memory ran at 0.5 GiB/s against 5.7 GiB/s for memory written before, so a transfer
of 64 MiB took 140 ms instead of 11. Freed the usual way, a large buffer is unmapped
at once, and the next transfer of the same size starts from fresh memory again.

So a buffer of ``POOL_FROM`` bytes or more is a memory map of its own, handed out
through a ``ctypes`` array over it. When the last value using it is gone, the array's
finalizer puts the map back here, and the next buffer of about the same size reuses
it, its pages in place. The pool keeps at most ``limit`` bytes of unused maps (a
worker with a memory limit lowers it to its fetch budget); ``clear`` unmaps them all
(a worker about to spill does). Thread-safe: the last use of a value may end in any
thread.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref

#: Buffers from this size up come from the pool; smaller ones are ``bytearray``s.
POOL_FROM = 1 << 20
#: Maps are sized in steps of this (a huge page), so that sizes close to each other
#: share them.
STEP = 2 << 20
#: A free map is reused for a buffer down to this fraction of its size, no smaller.
FIT = 0.75
#: Default bytes of unused maps kept.
DEFAULT_LIMIT = 512 << 20
#: Linux's advice that a mapping be backed by huge pages where it can (None elsewhere):
#: a 2 MiB page faults in once where 4 KiB pages would fault 512 times.
HUGE_PAGES: int | None = getattr(mmap, "MADV_HUGEPAGE", None)


class ReceivePool:
    """Unused memory maps by size, to receive large buffers into."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._free: dict[int, list[mmap.mmap]] = {}
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
                    mapped = maps.pop()
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
        with self._lock:
            if self._bytes + size <= self.limit:
                self._free.setdefault(size, []).append(mapped)
                self._bytes += size

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
