"""A process memory that a test sets, for workers under memory pressure without it.

``Worker(memory_limit=..., memory=MemoryConfig(measure=fake))`` reads its resident
memory from ``fake`` instead of the operating system, so a test can push a worker past
its spill or pause threshold with one assignment and no allocation::

    from apportion.testing import FakeClock, FakeMemory, InMemoryCluster
    from apportion.worker.memory_manager import MemoryConfig

    clock, memory = FakeClock(), FakeMemory()
    worker = {"memory_limit": 100 * 2**20, "memory": MemoryConfig(measure=memory)}
    with InMemoryCluster([worker], clock=clock) as cluster:
        memory.rss = 85 * 2**20  # above the pause threshold
        cluster.run(clock.advance(0.1))  # the worker's monitor sees it and pauses
"""

from __future__ import annotations


class FakeMemory:
    """Resident memory in bytes, as the test last set it (``rss``)."""

    def __init__(self, rss: int = 0) -> None:
        #: What the worker reads as its process's resident memory, bytes.
        self.rss = rss

    def __call__(self) -> int:
        return self.rss

    def __repr__(self) -> str:
        return f"FakeMemory(rss={self.rss})"
