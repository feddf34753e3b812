"""Tasks that wait on other tasks: seceding gives a thread and resources back.

A task that submits subtasks and waits for them (``secede()``, ``worker_client()``)
would otherwise hold its thread and its resources while it waits. With one GPU and a
task that holds it waiting on GPU subtasks, nothing can ever run: Dask deadlocks
there. Here the worker says ``TaskSeceded``: the task stays PROCESSING on its
worker but no longer counts on a thread, and unless it keeps them
(``keep_resources``, for a process that owns device state) its resources go back to
the ledger for its subtasks to take.

On ``TaskRejoining`` a task that gave nothing back counts again at once. One that did
waits in its worker's ``rejoining`` list, first asked first, until the very units
it held (its code may keep state on GPU 2, so GPU 3 would not do) are free; the
placement pass grants rejoins before it starts anything, and meanwhile the oldest
rejoining task's demand is held back from new tasks on that worker, so a stream of
new work cannot keep it waiting for ever. Rejoining does not wait for a thread: the
worker may run more than ``nthreads`` tasks until enough of them finish (Dask's rule).

A task that ends while seceded (without rejoining) is reported as any task; what it
gave back is not given back twice (``SchedulerState.unassign``).
"""

from __future__ import annotations

from apportion.core.resources import Amounts, describe_resources
from apportion.protocol.worker import TaskRejoining, TaskSeceded
from apportion.scheduler.events import SendRejoinGranted
from apportion.scheduler.records import PROCESSING, TaskRecord, WorkerRecord
from apportion.scheduler.state import SchedulerState


def _seceded_task(state: SchedulerState, worker: WorkerRecord, key: str) -> TaskRecord | None:
    """The task running on ``worker`` under ``key``, or None for a stale report."""
    task = state.tasks.get(key)
    if task is None or task.state != PROCESSING or task.worker != worker.id:
        return None
    return task


def task_seceded(state: SchedulerState, worker: WorkerRecord, msg: TaskSeceded) -> None:
    task = _seceded_task(state, worker, msg.key)
    if task is None or task.key in worker.seceded:
        return
    allocation = task.allocation
    give = not msg.keep_resources and allocation is not None and bool(allocation.resources)
    if give and allocation is not None:
        worker.ledger.give(allocation.resources, allocation.units)
        held = describe_resources(allocation.resources, allocation.units)
        cause = f"seceded on {worker.name}; gave back {held}"
    elif allocation is not None and allocation.resources:
        cause = f"seceded on {worker.name}; keeps its resources"
    else:
        cause = f"seceded on {worker.name}"
    worker.seceded[task.key] = give
    worker.started.add(task.key)
    if state.end_steal(task.key) is not None:  # it started: it cannot move any more
        cause += "; no longer moved to an idle worker, as it started"
    worker.rejoined.discard(task.key)
    state.log.append((state.now, task.key, PROCESSING, PROCESSING, cause))
    state.placement_due = True  # its thread, and maybe its resources, are free


def task_rejoining(state: SchedulerState, worker: WorkerRecord, msg: TaskRejoining) -> None:
    task = _seceded_task(state, worker, msg.key)
    if task is None or task.key not in worker.seceded or task.key in worker.rejoining:
        return
    if not worker.seceded[task.key]:
        _rejoined(state, worker, task, f"rejoined on {worker.name}")
        return
    worker.rejoining.append(task.key)
    state.log.append(
        (state.now, task.key, PROCESSING, PROCESSING, "rejoining; waits for its resources")
    )
    state.placement_due = True


def grant_rejoins(state: SchedulerState) -> None:
    """Give rejoining tasks their resources back where they are free, first asked first
    on each worker; called by the placement pass before it starts anything."""
    for worker in state.workers.values():
        waiting = worker.rejoining
        while waiting:
            task = state.tasks[waiting[0]]
            allocation = task.allocation
            assert allocation is not None, f"{task.key} rejoins holding nothing"
            if not worker.ledger.take_exactly(allocation.resources, allocation.units):
                break  # the rest of this worker's queue waits behind it: first come first
            waiting.pop(0)
            state.emit(SendRejoinGranted(worker.id, task.key))
            _rejoined(state, worker, task, f"rejoined on {worker.name}; holds its resources again")


def _rejoined(state: SchedulerState, worker: WorkerRecord, task: TaskRecord, cause: str) -> None:
    del worker.seceded[task.key]
    worker.rejoined.add(task.key)
    state.log.append((state.now, task.key, PROCESSING, PROCESSING, cause))


def kept_for_rejoin(state: SchedulerState, worker: WorkerRecord) -> Amounts | None:
    """What new tasks may not take on ``worker``: the demand of its oldest rejoining
    task, which no newer work may overtake."""
    if not worker.rejoining:
        return None
    return state.tasks[worker.rejoining[0]].resources
