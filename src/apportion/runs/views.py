"""A run's states, the one table of legal moves between them, and a run as the
job queue's lifecycle sees it. Pure: the journal and the lifecycle share these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STAGED = "staged"
"""Written down, not started: a scheduler serving the journal picks it up."""
QUEUED = "queued"
"""Waiting for a worker with the resources free."""
RUNNING = "running"
"""Its process was started on a worker."""
COMPLETED = "completed"
"""Exited with status 0."""
FAILED = "failed"
"""Exited otherwise, was killed, timed out, or can never start."""
CANCELLED = "cancelled"
"""Stopped or dropped at a user's request."""
LOST = "lost"
"""Its worker vanished while it ran and it is not to be run again."""

#: Every state, in the order a run goes through them (for tables and counts).
STATES = (STAGED, QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED, LOST)

#: Final states: a run in one never changes state again.
FINISHED = frozenset({COMPLETED, FAILED, CANCELLED, LOST})

#: Every legal change of state, as (from, to).
TRANSITIONS = frozenset(
    {
        (STAGED, QUEUED),  # mark_queued
        (STAGED, CANCELLED),  # request_cancel, at once
        (QUEUED, RUNNING),  # mark_running
        (QUEUED, FAILED),  # mark_ended: it can never start
        (QUEUED, CANCELLED),  # mark_ended: cancelled before it started
        (RUNNING, QUEUED),  # requeue: interrupted (its worker died), to run again
        (RUNNING, COMPLETED),
        (RUNNING, FAILED),
        (RUNNING, CANCELLED),
        (RUNNING, LOST),
    }
)


def check_move(run_id: int, old: str, new: str, only_from: str | None = None) -> None:
    """Raise ``ValueError`` unless a run may go from ``old`` to ``new`` (and ``old`` is
    ``only_from``, when given)."""
    if (old, new) not in TRANSITIONS or (only_from is not None and old != only_from):
        raise ValueError(f"run {run_id} is {old}; it cannot become {new}")


@dataclass(slots=True)
class RunView:
    """The lifecycle's view of one run it serves (the journal's record, once written)."""

    id: int
    #: How to name the run to people (``RunRecord.label``).
    label: str
    #: One of ``STATES``; moves only along ``TRANSITIONS``.
    state: str
    #: How many times it has started.
    attempts: int = 0
    #: How many times it may be started again after a failed attempt.
    retries: int = 0
    #: What it asks for, as users read it (``"gpu=1"``); "" for nothing.
    resources: str = ""
    #: The same in the scheduler's fixed-point amounts.
    demand: Mapping[str, int] = field(default_factory=dict)
    #: Worker name it runs on; "" unless running.
    worker: str = ""
    #: Resources its command holds, as its worker last said (``"gpu=[1]"``).
    held: str = ""
    #: A user asked to cancel it.
    cancel_requested: bool = False

    def move(self, new: str, only_from: str | None = None) -> None:
        """Change state along ``TRANSITIONS``; raise otherwise."""
        check_move(self.id, self.state, new, only_from)
        self.state = new
