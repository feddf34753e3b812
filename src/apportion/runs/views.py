"""A run as the job queue's lifecycle sees it. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from apportion.runs.run_states import check_run_move


@dataclass(slots=True)
class RunView:
    """The lifecycle's view of one run it serves (the journal's record, once written)."""

    id: int
    #: How to name the run to people (``RunRecord.label``).
    label: str
    #: One of ``run_states.STATES``; moves only along ``RUN_MOVES``.
    state: str
    #: How many times it has started.
    attempts: int = 0
    #: How many times it may be started again after a failed attempt.
    retries: int = 0
    #: How many of its attempts were preempted (stopped to let another share in):
    #: they use none of its retries.
    preemptions: int = 0
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

    def retries_left(self) -> int:
        """Retries it has not used: its attempts that failed, preempted ones aside."""
        return max(0, self.retries - (self.attempts - self.preemptions))

    def move(self, new: str, only_from: str | None = None) -> None:
        """Change state along ``RUN_MOVES``; raise ``IllegalTransition`` otherwise."""
        check_run_move(self.id, self.state, new, only_from)
        self.state = new
