"""Actors: a task whose result is an object that stays on its worker and takes calls.

The scheduler sees an actor as a task like any other until it finishes; then three
things differ, all decided here:

* **Its resources stay held.** A task's resources go back to the ledger when it
  finishes; an actor's are taken again at once, with the same units, and held while
  its result lives (``WorkerRecord.actors``). An actor that opened a GPU keeps that
  GPU until every client released it. No other task can have taken them in between:
  giving back and taking again happen in one handler. Unless its constructor
  seceded, gave them back and returned without rejoining while others held them:
  then it fails, as an actor without the resources it was placed for would
  over-commit its worker.
* **It never moves.** Its state lives in one process: replicate, rebalance and a
  draining worker's hand-off leave it where it is (copying the result would copy a
  handle that still points at the old worker).
* **It is not recomputed.** Running the constructor again would give a fresh object
  silently; an actor whose worker is lost fails instead, saying so.
"""

from __future__ import annotations

from collections.abc import Mapping

from apportion.core.allocation import Allocation
from apportion.scheduler.records import TaskRecord, WorkerRecord


def hold(worker: WorkerRecord, task: TaskRecord, allocation: Allocation | None) -> bool:
    """The actor ``task`` finished on ``worker``: hold what it ran with again.

    Given back by the same handler a moment ago, it is free, unless the constructor
    seceded, gave it back then, and ended without rejoining while other tasks held
    it: then False, holding nothing (the actor cannot live without it)."""
    if allocation is not None and allocation.resources:
        if not worker.ledger.take_exactly(allocation.resources, allocation.units):
            return False
        task.allocation = allocation
    worker.actors.add(task.key)
    return True


def release(workers: Mapping[str, WorkerRecord], task: TaskRecord) -> bool:
    """The actor ``task``'s result is dropped (or lost): its resources go back to its
    worker's ledger (with a worker that left, they went with it). True if some did,
    so that placement runs again."""
    allocation = task.allocation
    task.allocation = None
    worker = workers.get(task.worker or "")
    if worker is None or task.key not in worker.actors:
        return False
    worker.actors.discard(task.key)
    if allocation is not None and allocation.resources:
        worker.ledger.give(allocation.resources, allocation.units)
        return True
    return False


def movable(task: TaskRecord) -> bool:
    """Its result may be copied or moved to another worker."""
    return not task.actor


def unheld_text(task: TaskRecord, worker: WorkerRecord) -> str:
    """Why an actor built without its resources fails (``hold`` said False)."""
    return (
        f"actor {task.key!r} was built on {worker.name} after its constructor seceded, "
        "gave back its resources and did not rejoin, while other tasks took them: it "
        "would live without them, so it is dropped; rejoin before the constructor returns"
    )


def lost_text(task: TaskRecord, cause: str) -> str:
    """Why a lost actor fails rather than running its constructor again."""
    return (
        f"actor {task.key!r} was lost ({cause}); its state lived only there and is not "
        "recreated: submit the actor again"
    )
