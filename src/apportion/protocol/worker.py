"""Worker <-> scheduler: registration, tasks in and out, memory, stealing, leaving.

The scheduler assigns tasks (``ComputeTask``, after the function's ``LoadFunction``),
frees keys, prefetches inputs and steals work back; the worker reports what finished,
raised or was dropped, beats its heart, secedes and rejoins, drains and closes. A
supervisor's ``WorkerDied`` says how a process it watched ended.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from apportion.core.allocation import Allocation
from apportion.core.payload import Pickled
from apportion.protocol.base import Message, message


@message(28)
class RegisterWorker(Message):
    """Sent once after the handshake: who this worker is and what it offers."""

    name: str
    address: str  #: where peers and direct clients fetch data, "tcp://host:port"
    nthreads: int
    resources: dict[str, int]  #: supply in ticks (an indexed pool counts its units)
    pid: int
    memory_limit: int
    units: dict[str, list[str]]  #: indexed pools: name -> unit labels
    #: pid of the supervisor that restarts this process (0: none); a supervised
    #: worker's death is classified by its supervisor (``WorkerDied``).
    supervisor: int = 0
    #: Keys of tasks still running here (or finished and not yet reported) from an
    #: earlier session, that outlive sessions (command runs): the client serving
    #: their keys may adopt them instead of running them again (``TasksStillRunning``).
    live_tasks: list[str] = field(default_factory=list)


@message(29)
class TaskFinished(Message):
    key: str
    nbytes: int
    duration: float  #: seconds spent executing, used to size the pipeline
    type_name: str
    thread: int = 0  #: which of the worker's threads ran it (the task stream's row)


@message(30)
class TaskRaised(Message):
    key: str
    exception: Pickled
    traceback: Pickled
    duration: float
    thread: int = 0  #: which of the worker's threads ran it (the task stream's row)
    #: 1: it raised because an ``InterruptTasks`` stopped its work (it says so by
    #: raising ``TaskInterrupted``), not by failing on its own: a preempted task, to
    #: run again with its retries untouched, also when the scheduler that asked for
    #: the stop has restarted meanwhile. An int: the wire has no booleans.
    interrupted: int = 0


@message(31)
class ResultTooLarge(Message):
    """Worker -> scheduler: a task's result was larger than this worker can keep, so it
    was dropped at once; the task fails, out of memory (``worker.memory_policy``)."""

    key: str
    nbytes: int  #: the result's size, as ``sizeof`` estimates it
    type_name: str
    limit: int  #: the worker's memory limit, bytes
    largest: int  #: the largest result it keeps: its terminate threshold, or the limit
    duration: float


@message(32)
class MissingDependency(Message):
    """The worker could not fetch ``dep`` for ``key`` from any holder it was told of."""

    key: str
    dep: str
    holders: list[str]
    #: Empty when no holder had it; otherwise why it could not be sent (e.g. unpicklable).
    reason: str


@message(35)
class LoadFunction(Message):
    """A function the worker has not seen; it precedes the first task using it."""

    func_id: str
    blob: bytes


@message(36)
class ComputeTask(Message):
    key: str
    func_id: str
    args: Pickled
    who_has: dict[str, list[str]]  #: every dependency -> data addresses holding it
    priority: int
    allocation: Allocation  #: what it runs with: demand, units held, alternative chosen
    #: Each dependency's size in bytes as the scheduler knows it (0: not known), so the
    #: worker keeps what it fetches at once within its budget.
    sizes: dict[str, int] = field(default_factory=dict)
    #: Its place in the scheduler's start order (submission order within a priority):
    #: among tasks waiting for a thread, the worker starts the earliest first, not the
    #: one that arrived first, so a graph's later steps go ahead of new inputs.
    order: int = 0

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        key, func_id, args, who_has, priority, allocation, sizes, order = values
        return cls(key, func_id, args, who_has, priority, Allocation(*allocation), sizes, order)


@message(37)
class FreeKeys(Message):
    """Forget these keys: drop their data and, if still pending, the tasks."""

    keys: list[str]


@message(137)
class InterruptTasks(Message):
    """Stop the work of these running tasks (their cancel event: a command run is
    stopped, TERM, grace, KILL) and report each as it ends, as any task; unlike
    ``FreeKeys`` the result of one that completes meanwhile is kept (preemption)."""

    keys: list[str]


@message(38)
class Prefetch(Message):
    """A task reserved this worker and will run here next: fetch its inputs now, so
    that they are here when its resources free. Key -> its holders' data addresses."""

    who_has: dict[str, list[str]]
    sizes: dict[str, int] = field(default_factory=dict)  #: as in ``ComputeTask``


@message(39)
class DropPrefetch(Message):
    """The task those inputs were fetched for will not run here: drop them (kept only
    where a task here needs them)."""

    keys: list[str]


@message(42)
class TasksDropped(Message):
    """Worker -> scheduler: assigned tasks freed before they started; they never ran.

    Without this the scheduler could not tell "dropped" from "still running" and
    would hold the tasks' resources forever.
    """

    keys: list[str]


@message(43)
class StealRequest(Message):
    """Scheduler -> worker: let these assigned tasks go if they have not started here,
    as an idle worker would start them sooner. Answered by ``StealResponse``."""

    keys: list[str]


@message(44)
class StealResponse(Message):
    """Worker -> scheduler: of a ``StealRequest``'s keys, those let go (they were
    waiting here and never ran) and those already started (they stay). A key in
    neither was no longer here: its report was sent before this answer."""

    released: list[str]
    started: list[str]


@message(45)
class CopiesKept(Message):
    """Worker -> scheduler: it fetched these results from peers for its tasks and keeps
    the copies, as holders the scheduler frees like any other (Dask's ``add-keys``):
    the next task here that needs one finds it in memory."""

    keys: list[str]


@message(47)
class WorkerClosing(Message):
    """Worker -> scheduler, just before a deliberate close: not a crash, not a loss."""

    reason: str


@message(49)
class Heartbeat(Message):
    """Worker -> scheduler, every heartbeat interval: still alive (and how busy).

    Also sent at once when the worker pauses or resumes for its memory.
    """

    executing: int
    memory: int = 0  #: resident memory of the worker process, bytes (0: unknown)
    spilled: int = 0  #: bytes of results it moved to disk (as they were in memory)
    #: 1 while paused for its memory (it starts nothing new), else 0; an int
    #: because the wire has no booleans.
    paused: int = 0
    cpu: float = 0.0  #: CPU use of the worker process since the last heartbeat, % of a core
    received: int = 0  #: bytes of results fetched from peers since the worker started
    sent: int = 0  #: bytes of results served to peers since the worker started


@message(50)
class WorkerDraining(Message):
    """Worker -> scheduler: stop sending me tasks; I leave once mine are done.

    The scheduler answers ``DrainDone`` once the running tasks are finished and the
    results still needed were handed to other workers; the worker leaves after
    ``grace`` seconds whatever happens.
    """

    grace: float


@message(51)
class DrainDone(Message):
    """Scheduler -> draining worker: nothing here is needed any more; leave now."""

    handed_off: int  #: results copied to other workers


@message(52)
class WorkerDied(Message):
    """Supervisor -> scheduler: how a worker process it watched ended.

    Sent on a short connection of its own right after the supervisor reaps the
    process, so a poison task's error can say "killed by SIGKILL - likely out of
    memory" instead of "its connection closed".
    """

    name: str
    pid: int
    description: str
    #: 1 when it died of its memory: killed for passing its terminate threshold, or
    #: killed by a signal near its limit; an int because the wire has no booleans.
    out_of_memory: int = 0


@message(93)
class RestartWorker(Message):
    """Scheduler -> a supervised worker, at a restart: exit so that your supervisor
    starts a fresh process (exit status ``RESTART_EXIT`` of worker/supervisor.py)."""

    reason: str


@message(138)
class HeartbeatInterval(Message):
    """Scheduler -> worker: leave at least ``seconds`` between heartbeats (0: the
    worker's own interval). A scheduler of many workers stretches them, so that it
    hears about ``SchedulerConfig.heartbeats_per_second`` rather than one per worker
    per second (``scheduler/membership.py``, ``heartbeat_floor``)."""

    seconds: float


@message(104)
class TaskSeceded(Message):
    """Worker -> scheduler: the running task ``key`` gave its thread back (``secede``)
    to wait on other tasks. Unless ``keep_resources``, it gave back its resources too;
    it asks for them again with ``TaskRejoining``."""

    key: str
    keep_resources: bool


@message(105)
class TaskRejoining(Message):
    """Worker -> scheduler: the seceded task ``key`` counts on a thread again
    (``rejoin``); if it gave its resources back, it waits for ``RejoinGranted``."""

    key: str


@message(106)
class RejoinGranted(Message):
    """Scheduler -> worker: these seceded tasks hold their resources again; they run on."""

    keys: list[str]
