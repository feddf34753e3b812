"""A run's states and the one table of legal moves between them, shared by the
journal and the job queue's lifecycle. Pure."""

from __future__ import annotations

from apportion.core.transitions import IllegalTransition, check_move

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

#: Every legal move of a run, as (from, to): the journal and the lifecycle both
#: refuse anything else with ``IllegalTransition``.
RUN_MOVES = frozenset(
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


def check_run_move(run_id: int, old: str, new: str, only_from: str | None = None) -> None:
    """Raise ``IllegalTransition`` unless a run may go from ``old`` to ``new`` (and
    ``old`` is ``only_from``, when given)."""
    if only_from is not None and old != only_from:
        raise IllegalTransition("job queue", f"run {run_id}", old, new)
    check_move(RUN_MOVES, "job queue", f"run {run_id}", old, new)
