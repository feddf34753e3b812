"""What goes into ``WorkerState.handle`` (events) and what comes out (commands).

Every event carries the time it happened, read by the service, so the state
machine never reads a clock and tests can replay any history exactly. Commands
say what to do, never how: the service owns sockets, threads and the data store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from apportion.core.allocation import Allocation
from apportion.core.payload import Pickled
from apportion.protocol.base import Message
from apportion.protocol.worker import (
    ComputeTask,
    DropPrefetch,
    Prefetch,
    RejoinGranted,
    StealRequest,
)


class DataInfo(NamedTuple):
    """What the state keeps about a value: its size and type, never the value itself."""

    nbytes: int
    type_name: str


# --- events -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ComputeArrived:
    """The scheduler asked for ``task`` to run here."""

    task: ComputeTask
    time: float


@dataclass(frozen=True, slots=True)
class FreeArrived:
    """The scheduler no longer needs these keys here."""

    keys: tuple[str, ...]
    time: float


@dataclass(frozen=True, slots=True)
class StealArrived:
    """The scheduler would move these tasks to an idle worker, if they have not started."""

    keys: tuple[str, ...]
    time: float


@dataclass(frozen=True, slots=True)
class PrefetchArrived:
    """The scheduler expects a task here that needs these inputs: fetch them now."""

    who_has: Mapping[str, list[str]]
    time: float
    sizes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PrefetchDropped:
    """That task will not run here: its inputs fetched ahead may go."""

    keys: tuple[str, ...]
    time: float


@dataclass(frozen=True, slots=True)
class FetchDone:
    """A peer answered: ``obtained`` are in the data store now, ``missing`` it lacked."""

    address: str
    obtained: Mapping[str, DataInfo]
    missing: tuple[str, ...]
    time: float
    #: Held by the peer but impossible to send (e.g. unpicklable): key -> why.
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FetchFailed:
    """A peer could not be asked at all (unreachable, connection dropped)."""

    address: str
    keys: tuple[str, ...]
    reason: str
    time: float


@dataclass(frozen=True, slots=True)
class ExecutionOk:
    """A task returned; its result is in the data store already."""

    key: str
    info: DataInfo
    duration: float
    time: float
    #: The row of the thread that ran it (``worker.execution``): 0 .. nthreads-1,
    #: higher for a task that seceded.
    thread: int = 0


@dataclass(frozen=True, slots=True)
class ExecutionRaised:
    """A task raised; exception and traceback are pickled for the client."""

    key: str
    exception: Pickled
    traceback: Pickled
    duration: float
    time: float
    thread: int = 0  #: as ``ExecutionOk.thread``
    #: It raised ``TaskInterrupted`` (``TaskRaised.interrupted``).
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class ExecutionTooLarge:
    """A task returned a result larger than the worker keeps: it was dropped at once.

    ``limit`` is the worker's memory limit and ``largest`` the largest result it
    keeps (``MemoryLimits.largest_result``), bytes.
    """

    key: str
    info: DataInfo
    limit: int
    largest: int
    duration: float
    time: float


@dataclass(frozen=True, slots=True)
class DataPut:
    """``PutData`` values are in the data store now."""

    request_id: int
    stored: Mapping[str, DataInfo]
    time: float


@dataclass(frozen=True, slots=True)
class Paused:
    """The process's memory passed the pause threshold: start no task and no fetch.

    ``process`` and ``limit`` (bytes) are the figures that decided it, for the log.
    """

    process: int
    limit: int
    time: float


@dataclass(frozen=True, slots=True)
class Resumed:
    """The process's memory is back under the pause threshold: start what waited."""

    process: int
    limit: int
    time: float


@dataclass(frozen=True, slots=True)
class Seceded:
    """The running task ``key`` gave its thread back to wait on other tasks (``secede``);
    unless ``keep_resources``, its resources go back to the scheduler's ledger too."""

    key: str
    keep_resources: bool
    time: float


@dataclass(frozen=True, slots=True)
class Rejoining:
    """The seceded task ``key`` wants to run on a thread again (``rejoin``)."""

    key: str
    time: float


@dataclass(frozen=True, slots=True)
class RejoinGrantedArrived:
    """The scheduler gave these seceded tasks their resources back."""

    keys: tuple[str, ...]
    time: float


def arrival(
    message: ComputeTask | Prefetch | DropPrefetch | RejoinGranted | StealRequest, now: float
) -> WorkerEvent:
    """The event for a scheduler message that goes to the state as it is."""
    if isinstance(message, ComputeTask):
        return ComputeArrived(message, now)
    if isinstance(message, StealRequest):
        return StealArrived(tuple(message.keys), now)
    if isinstance(message, Prefetch):
        return PrefetchArrived(message.who_has, now, message.sizes)
    if isinstance(message, RejoinGranted):
        return RejoinGrantedArrived(tuple(message.keys), now)
    return PrefetchDropped(tuple(message.keys), now)


WorkerEvent = (
    ComputeArrived
    | FreeArrived
    | StealArrived
    | PrefetchArrived
    | PrefetchDropped
    | FetchDone
    | FetchFailed
    | ExecutionOk
    | ExecutionRaised
    | ExecutionTooLarge
    | DataPut
    | Paused
    | Resumed
    | Seceded
    | Rejoining
    | RejoinGrantedArrived
)


# --- commands -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fetch:
    """Ask the peer at ``address`` for ``keys`` (all keys wanted from it in one batch)."""

    address: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Execute:
    """Run a task whose inputs (``deps``) are all in the data store."""

    key: str
    func_id: str
    args: Pickled
    deps: tuple[str, ...]
    #: What it holds, as the scheduler allocated it.
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class SendToScheduler:
    message: Message


@dataclass(frozen=True, slots=True)
class ForgetData:
    """Delete these keys from the data store (absent keys are fine)."""

    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ResumeTask:
    """Let the thread of the task ``key``, blocked in ``rejoin``, run on: it holds its
    resources again (or never gave them back)."""

    key: str


WorkerCommand = Fetch | Execute | SendToScheduler | ForgetData | ResumeTask
