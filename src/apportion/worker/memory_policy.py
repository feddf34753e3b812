"""When a worker with a memory limit spills, pauses and resumes: a pure policy.

Theory of operation
-------------------
The thresholds are Dask's, as fractions of the worker's memory limit, and each
may be turned off (``False``, as in Dask's configuration):

- ``target`` (0.6): once the *managed* memory - the sizes of the results held in
  memory, as ``sizeof`` estimates them - passes it, the least recently used
  results move to disk until it is back under. The store checks it on every write,
  against a lower figure while the rest of the process is large: the spill
  threshold less the memory outside the store at the last sample. So writes alone
  never carry the process past ``spill``, and a worker whose limit is small beside
  its interpreter and its tasks' temporaries is not paused or killed by results
  arriving faster than the monitor looks (Dask's store checks ``target`` alone).
- ``spill`` (0.7): once the process's resident memory passes it (memory the
  sizes do not see: caches, fragmentation, a task's temporaries), results move
  to disk until the process would be back under ``target`` (under ``spill``
  itself when ``target`` is off).
- ``pause`` (0.8): while the process's resident memory is above it, the worker
  starts no task and no fetch. Dask's rule, no hysteresis: it resumes at the
  first sample at or below ``pause``. Spilling brings memory down to ``target``,
  well below ``pause``, so a worker that can spill does not flap; the service
  logs each change once.
- ``terminate`` (0.95): the supervisor kills the process and starts a fresh one
  (``worker.supervisor``). A task result larger than this alone is not kept: it is
  dropped as the task returns and the task fails, out of memory
  (``MemoryLimits.keeps``), instead of getting worker after worker killed.

``decide`` sees one ``MemorySample`` (time, resident bytes, managed bytes) and
whether the worker is paused now, and answers a ``MemoryDecision``: how many bytes
of results to spill, the bytes of results the store may keep in memory on its
writes until the next sample, and a ``Paused``/``Resumed`` event for the worker's
state machine when its state should change. Without a memory limit it never does
anything. It imports nothing but the worker's event types, so every rule is
tested with Hypothesis in microseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from apportion.worker.events import Paused, Resumed

#: A threshold: a fraction of the memory limit in (0, 1], or False for off.
Fraction = float | Literal[False]

#: Dask's names for the thresholds, in the order they act.
THRESHOLD_NAMES = ("target", "spill", "pause", "terminate")

#: Words that turn a threshold off on the command line and in Dask's configuration.
OFF_WORDS = frozenset({"off", "false", "no", "none"})


def parse_fraction(value: object, name: str) -> Fraction:
    """``0.6``, ``"0.6"``, ``False``, ``"off"``/``"false"`` -> a threshold.

    ``ValueError`` naming ``name`` for anything else (a fraction outside (0, 1],
    a word that is not a number).
    """
    if value is False:
        return False
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in OFF_WORDS:
            return False
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{name}: {value!r} is neither a fraction nor 'off'") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ValueError(f"{name}: {value!r} is neither a fraction nor False")
    if not 0 < number <= 1:
        raise ValueError(f"{name}: {number:g} is not a fraction of the limit in (0, 1]")
    return number


@dataclass(frozen=True, slots=True)
class MemoryThresholds:
    """Fractions of the memory limit, Dask's names and defaults; ``False`` turns one off."""

    target: Fraction = 0.6
    spill: Fraction = 0.7
    pause: Fraction = 0.8
    terminate: Fraction = 0.95

    def __post_init__(self) -> None:
        for name in THRESHOLD_NAMES:
            parse_fraction(getattr(self, name), name)  # raises on a bad one

    def describe(self, only: Iterable[str] = THRESHOLD_NAMES) -> str:
        """``target 0.6, spill 0.7, pause off, terminate 0.95``, for logs."""
        names = set(only)
        return ", ".join(
            f"{name} {_word(getattr(self, name))}" for name in THRESHOLD_NAMES if name in names
        )


def threshold_text(fraction: Fraction) -> str:
    """A threshold as the command line takes it back: ``0.6`` or ``off``."""
    return "off" if fraction is False else repr(fraction)


def _word(fraction: Fraction) -> str:
    return "off" if fraction is False else f"{fraction:g}"


#: Share of the memory limit that inputs being fetched from peers may take at once.
FETCH_FRACTION = 0.1
#: Share of the memory limit kept as unused receive memory for the next transfers
#: (``net/receive_pool.py``): a quarter of the fetch budget (under a 2 GiB limit,
#: one map for the next 32 MiB block). Every byte of it counts against the limit
#: and holds no result: on ``(x + x.T).sum()`` of 3.6 GiB under a 2 GiB limit
#: (``benchmarks/memory_order.py``), keeping the whole fetch budget put a worker's
#: peak 100 MiB above keeping none, and a quarter 40 MiB, for no speed we could
#: measure either way.
RECEIVE_POOL_FRACTION = FETCH_FRACTION / 4


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    """The thresholds in bytes for one limit; None where a threshold is off."""

    limit: int
    target: int | None
    spill: int | None
    pause: int | None
    terminate: int | None

    @classmethod
    def of(cls, limit: int, thresholds: MemoryThresholds) -> MemoryLimits:
        """``limit`` bytes (0: none, and then every threshold is off)."""

        def at(fraction: Fraction) -> int | None:
            return None if fraction is False or limit <= 0 else int(limit * fraction)

        return cls(
            max(0, limit),
            at(thresholds.target),
            at(thresholds.spill),
            at(thresholds.pause),
            at(thresholds.terminate),
        )

    @property
    def fetch_budget(self) -> int | None:
        """Most bytes a worker asks of its peers at once: ``FETCH_FRACTION`` of its
        limit, as Dask's ``memory.transfer``; None (no bound) without a limit."""
        return int(self.limit * FETCH_FRACTION) if self.limit > 0 else None

    @property
    def receive_pool_budget(self) -> int | None:
        """Most bytes of unused receive memory the worker's process keeps:
        ``RECEIVE_POOL_FRACTION`` of its limit; None (the pool's own default)
        without a limit."""
        return int(self.limit * RECEIVE_POOL_FRACTION) if self.limit > 0 else None

    @property
    def largest_result(self) -> int | None:
        """The largest result the worker keeps, in bytes; None: any (no limit).

        The terminate threshold, not the limit: a process holding a value is at
        least as large as the value, so past the threshold its supervisor kills it,
        and the result would be computed again and kill its next worker too. With
        ``terminate`` off, the limit itself, which the worker was told to stay under.
        Not lower: a result above ``target`` moves to disk, and whether it can be
        read back and sent depends on what else the process holds at that moment,
        which nobody knows now; deaths while serving it count at the scheduler
        (``scheduler.out_of_memory``) for those.
        """
        if self.limit <= 0:
            return None
        return self.terminate if self.terminate is not None else self.limit

    def keeps(self, nbytes: int) -> bool:
        """Whether a result of ``nbytes`` (as ``sizeof`` estimates it) may be kept."""
        largest = self.largest_result
        return largest is None or nbytes <= largest

    @property
    def floor(self) -> int | None:
        """What spilling for the process's memory aims at: ``target``, else ``spill``."""
        return self.target if self.target is not None else self.spill


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One reading of the worker process, taken by the service."""

    time: float
    #: Resident memory of the process, bytes.
    process: int
    #: Bytes of results held in memory (not on disk), as ``sizeof`` estimates them.
    managed: int


@dataclass(frozen=True, slots=True)
class MemoryDecision:
    """What one sample calls for."""

    #: Bytes of least-recently-used results to move to disk (0: none).
    spill: int = 0
    #: ``Paused`` or ``Resumed`` when the worker should change state, else None.
    change: Paused | Resumed | None = None
    #: Bytes of the process above the spill floor that even spilling every result
    #: would leave: memory outside the data store (0: none).
    unmanaged_excess: int = 0
    #: Bytes of results the store may keep in memory on its writes until the next
    #: sample: at most ``target``, and no more than keeps the process under ``spill``
    #: (None: no limit on writes, as with ``target`` off or no limit at all).
    store_target: int | None = None


#: The decision that does nothing.
NOTHING = MemoryDecision()


def decide(limits: MemoryLimits, sample: MemorySample, paused: bool) -> MemoryDecision:
    """What to do about ``sample`` for a worker that is ``paused`` now (see the module
    docstring). Never spills more than is managed, nor below the floor it aims at."""
    if limits.limit <= 0:
        return NOTHING
    excess = 0
    if limits.target is not None:
        excess = sample.managed - limits.target
    unmanaged = 0
    floor = limits.floor
    if limits.spill is not None and floor is not None and sample.process > limits.spill:
        excess = max(excess, sample.process - floor)
        unmanaged = max(0, sample.process - floor - sample.managed)
    spill = min(sample.managed, max(0, excess))
    should_pause = limits.pause is not None and sample.process > limits.pause
    change: Paused | Resumed | None = None
    if should_pause and not paused:
        change = Paused(sample.process, limits.limit, sample.time)
    elif paused and not should_pause:
        change = Resumed(sample.process, limits.limit, sample.time)
    return MemoryDecision(spill, change, unmanaged, store_target(limits, sample))


def store_target(limits: MemoryLimits, sample: MemorySample) -> int | None:
    """The bytes of results the store may keep in memory on writes, after ``sample``:
    ``target``, lowered to the spill threshold less what the process holds outside
    the store (never below 0); None with ``target`` off."""
    if limits.target is None:
        return None
    if limits.spill is None:
        return limits.target
    outside = max(0, sample.process - sample.managed)
    return max(0, min(limits.target, limits.spill - outside))
