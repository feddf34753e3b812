"""Generic hooks for clients that serve others (the job queue is one).

The scheduler knows nothing of what such a service does (``scheduler/task_hooks.py``):
it forwards requests of the kinds a service registered for, unread, relays notes
about running tasks, and offers tasks that outlived a worker's earlier session.
"""

from __future__ import annotations

from typing import Any

from apportion.protocol.base import Message, message
from apportion.protocol.tasks import TaskSpec


@message(94)
class TaskNote(Message):
    """Worker -> scheduler: a note about a running task, for the clients wanting its key.

    ``note`` is one encoded message (``codec.encode_message``) the scheduler forwards
    as it is (``TaskNoted``); it never reads it. A ``droppable`` note may be dropped
    when the worker must hold too much while the scheduler is away.
    """

    key: str
    note: bytes
    droppable: int  #: 1 or 0: the wire has no booleans


@message(95)
class TaskNoted(Message):
    """Scheduler -> client: a ``TaskNote`` about a task it wants, from worker ``worker``."""

    key: str
    worker: str
    note: bytes


@message(96)
class RegisterService(Message):
    """Client -> scheduler: serve the ``requests`` of these kinds (message class names)
    that other clients send, and hear of tasks still running on a worker that joins
    whose keys begin with ``key_prefix`` ("" for none)."""

    requests: list[str]
    key_prefix: str


@message(97)
class ForwardedRequest(Message):
    """Scheduler -> service: a request of client ``origin`` (an encoded message),
    which acts as ``person`` ("" for the owner, who may ask about anyone's work)."""

    origin: str
    request: bytes
    person: str = ""


@message(98)
class ForwardedReply(Message):
    """Service -> scheduler: the answer (an encoded message) to relay to ``origin``."""

    origin: str
    reply: bytes


@message(99)
class TasksStillRunning(Message):
    """Scheduler -> service: a worker joined with these tasks still running from an
    earlier session. ``states`` gives the state of those the scheduler has a task for.
    The service adopts them (``AdoptTask``) or has them stopped (``StopTasks``)."""

    worker_id: str
    worker: str
    keys: list[str]
    states: dict[str, str]


@message(100)
class AdoptTask(Message):
    """Service -> scheduler: submit ``task`` as already running on ``worker_id``,
    holding ``units``, instead of queueing it (its process is not started again)."""

    worker_id: str
    task: TaskSpec
    functions: dict[str, bytes]
    units: dict[str, list[str]]

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        worker_id, task, functions, units = values
        return cls(worker_id, TaskSpec(*task), functions, units)


@message(101)
class StopTasks(Message):
    """Service -> scheduler: have worker ``worker_id`` stop these tasks (``FreeKeys``)."""

    worker_id: str
    keys: list[str]


@message(102)
class WorkerDeparted(Message):
    """Scheduler -> service: the worker named ``name`` left and none of that name remains."""

    name: str


@message(103)
class Unserved(Message):
    """Scheduler -> client: nothing here serves requests of this kind (a class name),
    so none will be answered (a scheduler without a job queue asked about runs)."""

    kind: str
