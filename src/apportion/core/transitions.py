"""The one check behind every state machine's table of legal moves.

Three machines keep a table of the moves their items may make, as (from, to)
pairs: the scheduler's tasks (``scheduler.records.SCHEDULER_TASK_MOVES``), the
worker's tasks and data (``worker.records.WORKER_TASK_MOVES``) and the job queue's
runs (``runs.run_states.RUN_MOVES``). A move outside its table raises
``IllegalTransition``, which names the machine, the item and the move, so one
``except`` and one grep cover all three.
"""

from __future__ import annotations

from collections.abc import Collection


class IllegalTransition(AssertionError, ValueError):
    """A move outside a state machine's table of legal moves.

    An ``AssertionError`` because in the scheduler and the worker it is a bug, never a
    user's doing; also a ``ValueError`` because the journal's callers (the ``runs``
    command) pass a user's request along, such as cancelling a run that completed,
    and report it as a bad value.
    """

    def __init__(self, machine: str, item: str, old: str, new: str, detail: str = "") -> None:
        #: Which state machine refused: "scheduler", "worker" or "job queue".
        self.machine = machine
        #: What was to move, as people name it: ``task 'x'``, ``run 7``.
        self.item = item
        #: The state it is in.
        self.old = old
        #: The state it was to take.
        self.new = new
        self.detail = detail
        why = f" ({detail})" if detail else ""
        super().__init__(f"{machine}: {item} is {old}; it cannot become {new}{why}")

    def __reduce__(self) -> tuple[type[IllegalTransition], tuple[str, str, str, str, str]]:
        # The default would call ``__init__`` with the message alone.
        return type(self), (self.machine, self.item, self.old, self.new, self.detail)


def check_move(
    moves: Collection[tuple[str, str]],
    machine: str,
    item: str,
    old: str,
    new: str,
    detail: str = "",
) -> None:
    """Raise ``IllegalTransition`` unless ``(old, new)`` is one of ``moves``."""
    if (old, new) not in moves:
        raise IllegalTransition(machine, item, old, new, detail)
