"""What the job queue's lifecycle (``lifecycle.RunLifecycle``) takes and returns.

One frozen dataclass per event and per command. Events carry the time: ``now``
(monotonic) for deadlines, ``wall`` (epoch seconds) for the journal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from apportion.runs.views import RunView

#: How a run's task failed, as the scheduler said: (kind, message); None: it completed.
Failure = tuple[str, str] | None


# --- events -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resumed:
    """The queue starts: what the journal holds as queued and as running."""

    queued: tuple[RunView, ...]
    running: tuple[RunView, ...]
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class Submitted:
    """A client submitted runs, already written to the journal as queued."""

    runs: tuple[RunView, ...]
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class Polled:
    """A look at the journal: runs staged meanwhile, and cancels asked for."""

    staged: tuple[RunView, ...]
    cancels: tuple[int, ...]
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class TaskDone:
    """A run's task ended in the scheduler: completed (``failure`` None) or failed."""

    run_id: int
    failure: Failure
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class Started:
    """A worker started (or attached to) the run's command."""

    run_id: int
    worker: str
    held: str
    pid: int
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class Ended:
    """A worker says the run's processes are gone, and how its command ended."""

    run_id: int
    exit_code: int
    signal: int
    reason: str
    detail: str
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class WorkerGone:
    """The worker named ``name`` left (and no namesake replaced it)."""

    name: str
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class WorkerBack:
    """A worker (re)joined with runs still alive in it.

    ``task_states`` gives, for those of ``live_runs`` that have a task in the
    scheduler, the task's state (``"queued"``, ``"processing"``...).
    """

    worker_id: str
    name: str
    live_runs: tuple[int, ...]
    task_states: Mapping[int, str]
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class Preempted:
    """The scheduler is stopping the run on ``worker`` to let another share in
    (``reason``); it runs again later, as a new attempt."""

    run_id: int
    worker: str
    reason: str
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes: adoption deadlines may expire."""

    now: float
    wall: float


Event = (
    Resumed
    | Submitted
    | Polled
    | TaskDone
    | Started
    | Ended
    | Preempted
    | WorkerGone
    | WorkerBack
    | Tick
)


# --- commands ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Schedule:
    """Submit the run's task with this many retries left."""

    run_id: int
    retries_left: int


@dataclass(frozen=True, slots=True)
class Adopt:
    """Record the run's task as already running on ``worker_id`` holding ``held``."""

    worker_id: str
    run_id: int
    retries_left: int
    held: str


@dataclass(frozen=True, slots=True)
class Release:
    """The queue is done with the run's task."""

    run_id: int


@dataclass(frozen=True, slots=True)
class CancelTask:
    """Cancel the run's task (its worker stops the command: TERM, grace, KILL)."""

    run_id: int


@dataclass(frozen=True, slots=True)
class StopStrays:
    """Tell a worker to stop copies of runs nobody wants there."""

    worker_id: str
    run_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MarkQueued:
    """Journal: staged runs are queued."""

    run_ids: tuple[int, ...]
    wall: float


@dataclass(frozen=True, slots=True)
class NewAttempt:
    """Logs: the run starts attempt ``attempts + 1``; its output is placed after what is
    logged so far (with a banner when earlier attempts logged something)."""

    run_id: int
    attempts: int


@dataclass(frozen=True, slots=True)
class MarkRunning:
    """Journal: the run started on ``worker`` holding ``held``."""

    run_id: int
    worker: str
    held: str
    wall: float


@dataclass(frozen=True, slots=True)
class Requeue:
    """Journal: the run was interrupted and is to run again; ``preempted``: it was
    stopped to let another share in (counted apart: it uses no retry)."""

    run_id: int
    reason: str
    wall: float
    preempted: bool = False


@dataclass(frozen=True, slots=True)
class MarkEnded:
    """Journal: the run finished in ``state``; its log's bookkeeping is dropped."""

    run_id: int
    state: str
    exit_code: int | None
    signal: int | None
    reason: str
    wall: float


@dataclass(frozen=True, slots=True)
class Note:
    """Journal: a line in the run's history."""

    run_id: int
    text: str
    wall: float


@dataclass(frozen=True, slots=True)
class SetWaiting:
    """Journal: why the run is not running yet."""

    run_id: int
    text: str


@dataclass(frozen=True, slots=True)
class Say:
    """A line for the log (``level`` ``"info"`` or ``"warning"``)."""

    level: str
    text: str


JournalCommand = MarkQueued | NewAttempt | MarkRunning | Requeue | MarkEnded | Note | SetWaiting
Command = Schedule | Adopt | Release | CancelTask | StopStrays | JournalCommand | Say
