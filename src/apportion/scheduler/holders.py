"""Which workers hold a result: the one that made it (``worker``) and copies.

A result in memory lives on ``TaskRecord.worker`` and, after a replicate or a
rebalance, on the workers in ``TaskRecord.replicas`` too. Losing one holder loses
nothing while another is left: a copy is promoted to be ``worker``. These helpers
keep ``WorkerRecord.has_what`` and ``nbytes`` in step with the records; they send
nothing, so each caller decides whether the worker is told to drop its copy.
"""

from __future__ import annotations

from apportion.scheduler.records import TaskRecord, WorkerRecord


def holders(task: TaskRecord) -> list[str]:
    """Ids of the workers holding ``task``'s result, the original holder first."""
    if task.worker is None:
        return []
    if not task.replicas:
        return [task.worker]
    return [task.worker, *sorted(task.replicas)]


def holds(task: TaskRecord, worker_id: str) -> bool:
    """Whether the worker ``worker_id`` holds ``task``'s result (original or copy)."""
    return task.worker == worker_id or (task.replicas is not None and worker_id in task.replicas)


def add_holder(task: TaskRecord, worker: WorkerRecord) -> bool:
    """``worker`` stored a copy of ``task``'s result (in memory); False if it had one."""
    if holds(task, worker.id):
        return False
    if task.replicas is None:
        task.replicas = set()
    task.replicas.add(worker.id)
    worker.has_what.add(task.key)
    worker.nbytes += task.nbytes
    return True


def drop_holder(task: TaskRecord, worker: WorkerRecord) -> bool:
    """``worker`` no longer holds ``task``'s result; True while another holder has it.

    When the last holder goes, ``worker`` stays on the record: the caller decides
    what the loss means (``lose_result``, ``keep_released``, ``remove``).
    """
    if not holds(task, worker.id):
        return task.worker is not None
    if task.replicas:
        worker.has_what.discard(task.key)
        worker.nbytes -= task.nbytes
        if task.worker == worker.id:
            task.worker = min(task.replicas)
        task.replicas.discard(task.worker or "")
        task.replicas.discard(worker.id)
        if not task.replicas:
            task.replicas = None
        return True
    return False


def clear_replicas(task: TaskRecord, workers: dict[str, WorkerRecord]) -> list[str]:
    """Drop every copy but the original holder's; the ids of the workers that held one."""
    dropped = sorted(task.replicas or ())
    for worker_id in dropped:
        worker = workers.get(worker_id)
        if worker is not None:
            worker.has_what.discard(task.key)
            worker.nbytes -= task.nbytes
    task.replicas = None
    return dropped
