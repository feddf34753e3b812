"""What the scheduler has seen happen, counted as it happens: the facts behind the
dashboard, ``apportion status``, ``/metrics`` and ``performance_report``.

Every view of the cluster must cost nothing per queued task when it is read, so
that a page open on 100,000 queued tasks stays live: whatever would need a pass
over every record is counted here instead, by the core as tasks move
(``SchedulerState.move``), finish (``worker_reports``) and warn (``SchedulerState.warn``).
That costs a few dictionary updates per transition, paid whether or not anybody
looks; everything else a view shows is read from the records it already bounds
(workers, running tasks, queue heads).

Pure: no clock, no I/O; times are the scheduler's (``state.now``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import NamedTuple

from apportion.core.allocation import Allocation
from apportion.core.groups import group_of
from apportion.core.resources import Amounts, Units
from apportion.scheduler.records import (
    ERRED,
    FORGOTTEN,
    MEMORY,
    NEW,
    NO_RESOURCES,
    PROCESSING,
    QUEUED,
    GroupTally,
    Histogram,
    QueueKey,
    TaskRecord,
    WorkerRecord,
)

#: Finished executions kept for the task stream and ``performance_report``.
STREAM_SIZE = 50_000
#: Warnings kept for the dashboard's event list.
EVENTS_SIZE = 1_000
#: Groups whose tasks are all forgotten kept (with what they did) before the oldest go.
FINISHED_GROUPS = 100
#: Groups with a duration histogram of their own; later groups count under "other",
#: so that keys without a shared prefix cannot grow the metrics without bound.
HISTOGRAM_GROUPS = 100

#: Key stems whose group is remembered; the memory is cleared past this many.
MAX_STEMS = 10_000

_new_tuple = tuple.__new__

#: What an execution without indexed pools held: one shared empty mapping.
NO_UNITS: Units = {}


class Execution(NamedTuple):
    """One task's run on a worker, as the task stream draws it."""

    seq: int  #: increasing: a view asks for what came after the last one it saw
    worker: str  #: the worker's address
    thread: int  #: which of its threads ran it (0 .. nthreads-1, higher if seceded)
    key: str
    group: str
    start: float  #: scheduler time: the report's arrival less the run's duration
    stop: float  #: scheduler time the report arrived
    ok: bool  #: False: it raised
    resources: Amounts  #: what it held while it ran
    units: Units  #: the units of indexed pools it held


class Warned(NamedTuple):
    """A warning the scheduler gave, as the dashboard lists it."""

    seq: int
    time: float
    level: str
    text: str


class Telemetry:
    """Counters kept by the core as things happen (see the module)."""

    def __init__(self) -> None:
        #: Groups with live records, by name; a group whose records are all forgotten
        #: moves to ``finished_groups``, the oldest of which are dropped.
        self.groups: dict[str, GroupTally] = {}
        self.finished_groups: OrderedDict[str, GroupTally] = OrderedDict()
        #: Group names by key stem (the key without its last ``-`` part when that is
        #: not a word): ``group_of`` runs once per stem, not once per task.
        self._stems: dict[str, str] = {}
        #: QUEUED tasks by kind of request (their queue key), for the pending view.
        self.queued_kinds: dict[QueueKey, int] = {}
        self.stream: deque[Execution] = deque(maxlen=STREAM_SIZE)
        self.stream_seq = 0
        self.events: deque[Warned] = deque(maxlen=EVENTS_SIZE)
        self.events_seq = 0
        #: Run times per group (up to HISTOGRAM_GROUPS of them, then "other").
        self.group_durations: dict[str, Histogram] = {}
        #: Bytes workers that have left had received from and sent to their peers, so
        #: that the cluster's totals never go down.
        self.received_by_departed = 0
        self.sent_by_departed = 0

    # --- kept by the core ----------------------------------------------------------

    def moved(self, task: TaskRecord, old: str, new: str) -> None:
        """``task`` moves from ``old`` to ``new`` (``SchedulerState.move``)."""
        tally = task.group
        if tally is None:
            tally = task.group = self.tally(task.key)
        if old == QUEUED or new == QUEUED:
            self._queued(task.queue, old, new)
        if old == NEW:
            tally.live += 1
        else:
            tally.states[old] -= 1
        if new == FORGOTTEN:
            tally.live -= 1
            if not tally.live:
                self._retire(tally)
            return
        tally.states[new] += 1
        if new == MEMORY and old == PROCESSING:
            tally.done += 1
        elif new == ERRED:
            # The error is set before the move (``SchedulerState.fail``), so that a
            # cancellation, and what failed because of one, is told from a failure.
            error = task.error
            if error is not None and error[0] == "cancelled":
                tally.cancelled += 1
            else:
                tally.failed += 1

    def _queued(self, kind: QueueKey, old: str, new: str) -> None:
        kinds = self.queued_kinds
        if old == QUEUED:
            left = kinds[kind] - 1
            if left:
                kinds[kind] = left
            else:
                del kinds[kind]
        if new == QUEUED:
            kinds[kind] = kinds.get(kind, 0) + 1

    def tally(self, key: str) -> GroupTally:
        """The tally of the group ``key`` belongs to, made (or revived) if need be."""
        name = self._group_name(key)
        tally = self.groups.get(name)
        if tally is None:
            tally = self.finished_groups.pop(name, None) or GroupTally(name)
            self.groups[name] = tally
        return tally

    def _group_name(self, key: str) -> str:
        """``group_of(key)``, computed once per stem (see ``_stems``)."""
        if key.startswith("("):
            stem = key.partition(",")[0]  # a tuple key: its name decides
        else:
            stem, _, last = key.rpartition("-")
            if not stem or last.isalpha():  # a word: part of the name, or not
                return group_of(key)
        name = self._stems.get(stem)
        if name is None:
            if len(self._stems) >= MAX_STEMS:
                self._stems.clear()
            name = self._stems[stem] = group_of(key)
        return name

    def _retire(self, tally: GroupTally) -> None:
        del self.groups[tally.name]
        self.finished_groups[tally.name] = tally
        while len(self.finished_groups) > FINISHED_GROUPS:
            self.finished_groups.popitem(last=False)

    def executed(
        self,
        task: TaskRecord,
        worker: WorkerRecord,
        allocation: Allocation | None,
        thread: int,
        duration: float,
        now: float,
        ok: bool,
    ) -> None:
        """``worker`` reported ``task`` finished (``ok``) or raised, ``duration`` in;
        it had held ``allocation`` there."""
        tally = task.group
        if tally is None:  # cannot be: it moved to PROCESSING; kept total all the same
            tally = task.group = self.tally(task.key)
        self.stream_seq += 1
        # tuple.__new__ rather than Execution(...): a NamedTuple's own constructor is
        # a Python function, several times slower, and this runs once per task.
        self.stream.append(
            _new_tuple(
                Execution,
                (
                    self.stream_seq,
                    worker.address,
                    thread,
                    task.key,
                    tally.name,
                    now - duration,
                    now,
                    ok,
                    allocation.resources if allocation is not None else NO_RESOURCES,
                    allocation.units if allocation is not None else NO_UNITS,
                ),
            )
        )
        histogram = tally.durations
        if histogram is None:
            name = tally.name if len(self.group_durations) < HISTOGRAM_GROUPS else "other"
            histogram = tally.durations = self.group_durations.setdefault(name, Histogram())
        histogram.observe(duration)

    def warned(self, now: float, level: str, text: str) -> None:
        """The scheduler logged a warning: the dashboard lists it."""
        self.events_seq += 1
        self.events.append(Warned(self.events_seq, now, level, text))

    def worker_left(self, worker: WorkerRecord) -> None:
        """Keep what ``worker`` moved in the totals after its record is gone."""
        self.received_by_departed += worker.received
        self.sent_by_departed += worker.sent

    def all_durations(self) -> Histogram:
        """Every execution's run time: the groups' histograms added up."""
        total = Histogram()
        for histogram in self.group_durations.values():
            total.count += histogram.count
            total.sum += histogram.sum
            total.buckets = [a + b for a, b in zip(total.buckets, histogram.buckets, strict=True)]
        return total

    # --- read by views ---------------------------------------------------------------

    def stream_since(self, seq: int, limit: int) -> list[Execution]:
        """The executions after ``seq``, at most the last ``limit`` of them."""
        stream = self.stream
        if not stream or stream[-1].seq <= seq:
            return []
        # Seqs are consecutive within the deque: index arithmetic, not a scan.
        first = max(seq + 1, stream[-1].seq - limit + 1, stream[0].seq)
        start = first - stream[0].seq
        return [stream[i] for i in range(start, len(stream))]

    def events_since(self, seq: int) -> list[Warned]:
        """The warnings after ``seq``, oldest first."""
        return [event for event in self.events if event.seq > seq]
