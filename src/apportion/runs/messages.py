"""The job queue's messages: its own conversation, carried by the engine unread.

Clients ask the queue through the scheduler, which forwards these requests to the
client serving them (``RegisterService``, ``protocol/services.py``) without reading
them; a run's worker reports on it in ``TaskNote``s. The engine never handles them,
but every process must be able to decode them: the package root imports this
module, as the ``protocol`` layer below may not.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from apportion.protocol.base import Message, message


@message(55)
class RunStarted(Message):
    """Worker -> scheduler: a run's command started (again, for an adopted run)."""

    run_id: int
    pid: int
    held: str  #: resources held, as users write them: ``"gpu=[0] foo=5"``


@message(56)
class RunOutput(Message):
    """Worker -> scheduler: the next bytes of a run's combined stdout and stderr.

    ``offset`` is where they start in the run's log, so that output sent again
    after a reconnection is written once.
    """

    run_id: int
    offset: int
    data: bytes


@message(57)
class RunEnded(Message):
    """Worker -> scheduler: a run's processes are all gone; how it ended."""

    run_id: int
    exit_code: int  #: -1 when it did not exit by itself
    signal: int  #: 0 when no signal killed it
    #: "completed", "failed", "timed out", "cancelled", "preempted" (stopped by an
    #: interruption, to run again), "could not start"
    reason: str
    detail: str  #: one line for users: "exit code 3", "cancelled; stopped with SIGTERM"


@message(58)
class SubmitRuns(Message):
    """Client -> scheduler: queue these runs (``RunSpec.to_dict()`` each)."""

    request_id: int
    specs: list[dict[str, Any]]


@message(59)
class RunsSubmitted(Message):
    """The ids given to submitted runs, or why none was accepted."""

    request_id: int
    ids: list[int]
    error: str
    #: One ``[kind, text]`` per id: what the connected workers make of its request
    #: (``scheduler.unsatisfiable.check_demand``); kind "" when one could run it.
    verdicts: list[list[str]] = field(default_factory=list)


@message(62)
class QueryRuns(Message):
    """Client -> scheduler: the state of these runs (to follow their progress)."""

    request_id: int
    ids: list[int]


@message(63)
class CancelRuns(Message):
    """Client -> scheduler: cancel these runs; answered like ``QueryRuns``."""

    request_id: int
    ids: list[int]


@message(64)
class RunsReport(Message):
    """Scheduler -> client: one dict per run (id, label, state, worker, held, outcome)."""

    request_id: int
    runs: list[dict[str, Any]]


@message(135)
class CancelPersonRuns(Message):
    """Owner -> scheduler: cancel every run of ``person`` not finished (they were
    removed: ``apportion user remove``); answered like ``CancelRuns``."""

    request_id: int
    person: str
