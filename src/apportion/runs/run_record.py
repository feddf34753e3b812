"""One run as the journal has it, and how its process ended, in words.

What readers of the journal get back (``apportion runs``, the dashboard, the job
queue when it starts), apart from the SQL that stores it (``journal.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from signal import Signals

from apportion.runs.spec import RunSpec

#: How the ``reason`` of a run stopped at its time limit begins (tables show just this).
TIMED_OUT = "timed out"


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as the journal has it: its spec and everything that happened to it."""

    #: Unique for the journal's lifetime; never reused.
    id: int
    #: The spec's name ("" if none), kept as a column to find runs by name.
    name: str
    #: One of ``STATES``.
    state: str
    spec: RunSpec
    #: Higher starts earlier.
    priority: int
    created: float
    #: When its latest attempt started; None until it first starts.
    started: float | None
    #: When it finished; set exactly when ``state`` is in ``FINISHED``.
    ended: float | None
    #: Worker it runs or last ran on; "" if it never started or was requeued.
    worker: str
    #: Resources held on that worker, as text (``"gpu=[0] foo=5"``); "" if none.
    held: str
    #: How many times it has started.
    attempts: int
    exit_code: int | None
    #: Number of the signal that killed it, if one did.
    signal: int | None
    #: One line: why it failed, was cancelled, lost or interrupted; "" otherwise.
    reason: str
    #: A user asked to cancel it; the scheduler has yet to act if it is not finished.
    cancel_requested: bool
    #: Id of the first run of its array; None when not in an array.
    array_id: int | None
    array_index: int | None
    #: Why it is not running yet, as the scheduler last wrote; "" when it does not apply.
    waiting: str
    #: How many of its ``attempts`` were stopped to let another share in (preempted):
    #: not failures, so they use none of its retries.
    preemptions: int = 0

    def label(self) -> str:
        """How to name the run to people: ``"sweep[3]"``, ``"sweep"``, or its id."""
        if not self.name:
            return str(self.id)
        if self.array_index is None:
            return self.name
        return f"{self.name}[{self.array_index}]"


def describe_exit(exit_code: int | None, signal: int | None) -> str:
    """How a process ended, shortly: ``"exit 1"``, ``"SIGKILL"``; ``""`` if unknown."""
    if signal is not None:
        try:
            return Signals(signal).name
        except ValueError:
            return f"signal {signal}"
    if exit_code is not None:
        return f"exit {exit_code}"
    return ""
