"""A worker's memory management: its spill store, its scratch directory, its monitor.

With a memory limit (and no data mapping of the user's own), the worker's data is
a ``SpillStore`` in a ``LocalDirectory`` of its own, which keeps the values in
memory under the ``target`` threshold by itself on every write. Every
``monitor_interval`` seconds (100 ms, as in Dask) the monitor reads the process's
resident memory, asks ``memory_policy.decide`` what to do, and does it: spill,
lower or restore the store's own target (the room left under ``spill`` by what the
process holds outside the store), pause, resume. Pausing and resuming are events
for the worker's state machine, handed to the worker's ``change`` callback, which
owns what a pause holds back.

Without a limit nothing of this runs: no directory, no store, no monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from apportion.clock import Clock
from apportion.core.sizes import format_bytes
from apportion.net.receive_pool import POOL
from apportion.worker.events import Paused, Resumed
from apportion.worker.local_directory import LocalDirectory
from apportion.worker.memory_policy import (
    MemoryDecision,
    MemoryLimits,
    MemorySample,
    MemoryThresholds,
    decide,
)
from apportion.worker.spill import SpillStore

logger = logging.getLogger("apportion.worker")

#: Seconds between two readings of the process's memory, as Dask's default.
DEFAULT_MONITOR_INTERVAL = 0.1


class ProcessMemory:
    """Reads this process's resident memory in bytes (psutil); 0 when it cannot."""

    def __init__(self) -> None:
        self._process = psutil.Process()

    def __call__(self) -> int:
        try:
            return int(self._process.memory_info().rss)
        except psutil.Error:
            return 0


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How a worker manages its memory under its limit (``Worker(memory=...)``)."""

    thresholds: MemoryThresholds = field(default_factory=MemoryThresholds)
    #: Seconds between two readings of the process's memory.
    monitor_interval: float = DEFAULT_MONITOR_INTERVAL
    #: Where the worker makes its scratch directory (Dask's ``local_directory``);
    #: None: the system's temporary directory.
    local_directory: str | None = None
    #: Reads the process's resident memory in bytes; ``ProcessMemory()`` by default.
    #: Tests pass a fake, so that no test needs to allocate what it checks.
    measure: Callable[[], int] | None = None

    def __post_init__(self) -> None:
        if not self.monitor_interval > 0:
            raise ValueError(f"monitor_interval must be positive, got {self.monitor_interval}")


class MemoryManager:
    """The data store, scratch directory and monitor of one worker; see the module
    docstring. ``data``: the user's own mapping, if any (it is never spilled)."""

    def __init__(
        self,
        limit: int,
        config: MemoryConfig | None,
        data: MutableMapping[str, Any] | None,
        name: str,
    ) -> None:
        self.config = config if config is not None else MemoryConfig()
        self.limits = MemoryLimits.of(limit, self.config.thresholds)
        #: Reads the process's resident memory (also for heartbeats).
        self.measure: Callable[[], int] = self.config.measure or ProcessMemory()
        self.name = name
        #: The worker's scratch directory; None without a limit or with the user's data.
        self.directory: LocalDirectory | None = None
        #: The spilling data store; None when ``data`` is plain memory.
        self.store: SpillStore | None = None
        if data is None and self.limits.limit > 0:
            self.directory = LocalDirectory(self.config.local_directory)
            self.store = SpillStore(self.directory.path / "spill", self.limits.target)
            data = self.store
        elif data is not None and self.limits.limit > 0:
            logger.info(
                "worker %s: its data mapping is its own, so nothing is spilled; "
                "pausing still applies",
                name,
            )
        #: What the worker stores its results in.
        self.data: MutableMapping[str, Any] = data if data is not None else {}
        self._task: asyncio.Task[None] | None = None
        #: Said that memory outside the data store is too high, and not yet seen it fall.
        self._unmanaged_said = False

    @property
    def managed(self) -> int:
        """Bytes of results in memory, as ``sizeof`` estimates them (0 if unknown)."""
        return self.store.memory_bytes if self.store is not None else 0

    @property
    def spilled(self) -> int:
        """Bytes of results on disk, as ``sizeof`` estimated them in memory."""
        return self.store.spilled_bytes if self.store is not None else 0

    def start(
        self,
        clock: Clock,
        paused: Callable[[], bool],
        change: Callable[[Paused | Resumed], None],
    ) -> None:
        """Start the monitor (with a limit): ``paused`` reads the worker's state,
        ``change`` hands it a ``Paused`` or ``Resumed`` event."""
        if self.limits.limit <= 0 or self._task is not None:
            return
        budget = self.limits.receive_pool_budget
        if budget is not None:
            # Unused receive memory counts against the limit as any other, and
            # holds nothing: keep little of it, enough for the next input or two.
            POOL.cap(budget)
        logger.info(
            "worker %s: memory limit %s; %s; results spill to %s",
            self.name,
            format_bytes(self.limits.limit),
            self.config.thresholds.describe(),
            self.store.directory if self.store is not None else "nowhere (data of its own)",
        )
        self._task = asyncio.create_task(
            self._monitor(clock, paused, change), name=f"memory-{self.name}"
        )

    async def _monitor(
        self,
        clock: Clock,
        paused: Callable[[], bool],
        change: Callable[[Paused | Resumed], None],
    ) -> None:
        while True:
            await clock.sleep(self.config.monitor_interval)
            decision = self.check(clock.time(), paused())
            if decision.change is not None:
                change(decision.change)

    def check(self, now: float, paused: bool) -> MemoryDecision:
        """Take one sample, spill as decided, log what changed; return the decision
        (its ``change`` is for the caller to carry out)."""
        sample = MemorySample(now, self.measure(), self.managed)
        decision = decide(self.limits, sample, paused)
        if self.store is not None:
            self.store.target = decision.store_target
        if decision.change is not None:
            self._log_change(decision.change)
        if decision.spill:
            POOL.clear()  # before any result goes to disk
        else:
            POOL.release_idle()  # what no transfer wanted for a while
        if decision.spill and self.store is not None:
            count = self.store.spilled_count
            moved = self.store.evict(decision.spill)
            logger.debug(
                "worker %s: process memory %s: spilled %d results (%s) to disk",
                self.name,
                format_bytes(sample.process),
                self.store.spilled_count - count,
                format_bytes(moved),
            )
        self._say_unmanaged(sample, decision)
        return decision

    def _log_change(self, event: Paused | Resumed) -> None:
        share = 100 * event.process / event.limit
        if isinstance(event, Paused):
            logger.warning(
                "worker %s: paused at %s of memory (%.0f%% of its %s limit): it starts "
                "no task and no fetch until its memory falls below the pause threshold",
                self.name,
                format_bytes(event.process),
                share,
                format_bytes(event.limit),
            )
        else:
            logger.warning(
                "worker %s: resumed at %s of memory (%.0f%% of its %s limit)",
                self.name,
                format_bytes(event.process),
                share,
                format_bytes(event.limit),
            )

    def _say_unmanaged(self, sample: MemorySample, decision: MemoryDecision) -> None:
        """Once per episode: memory the store does not hold keeps the process high."""
        if not decision.unmanaged_excess:
            self._unmanaged_said = False
            return
        if self._unmanaged_said:
            return
        self._unmanaged_said = True
        logger.warning(
            "worker %s: process memory %s is above its spill threshold, and only %s "
            "of it is results that can spill: the rest is memory outside the data "
            "store (a task's temporaries, a leak, or memory not returned to the system yet)",
            self.name,
            format_bytes(sample.process),
            format_bytes(sample.managed),
        )

    async def close(self) -> None:
        """Stop the monitor, delete the spill files and the scratch directory."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.store is not None:
            self.store.clear()
        if self.directory is not None:
            self.directory.remove()
