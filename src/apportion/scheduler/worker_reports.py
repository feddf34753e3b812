"""Worker reports: tasks finished, raised, dropped, inputs missing, departures.

Functions over ``SchedulerState``; ``state.py`` dispatches each worker message here.
Every report of a task the worker was running returns that task's resources
(``running_task``) before anything else is decided about it.
"""

from __future__ import annotations

from apportion.core.allocation import Allocation
from apportion.protocol.worker import (
    Heartbeat,
    MissingDependency,
    TaskFinished,
    TaskRaised,
    TasksDropped,
    WorkerClosing,
)
from apportion.scheduler import actors, preemption
from apportion.scheduler.holders import drop_holder, holders, holds
from apportion.scheduler.records import (
    ERRED,
    MEMORY,
    PROCESSING,
    TaskRecord,
    WorkerRecord,
)
from apportion.scheduler.state import SchedulerState


def running_task(state: SchedulerState, worker: WorkerRecord, key: str) -> TaskRecord | None:
    """The task ``worker`` reports on, or None (after freeing its data) if stale."""
    task = state.tasks.get(key)
    if task is None or task.state != PROCESSING or task.worker != worker.id:
        if task is None or not holds(task, worker.id):  # a copy it holds stays
            state.free_keys[worker.id].append(key)
        return None
    state.unassign(task, worker)
    return task


def task_finished(state: SchedulerState, worker: WorkerRecord, msg: TaskFinished) -> None:
    allocation = _allocation_of(state, msg.key)  # before ``running_task`` gives it back
    task = running_task(state, worker, msg.key)
    if task is None:
        return
    # Stopped to let another share in, it completed first: it simply completed.
    preemption.settle(state, worker, task.key)
    worker.thread_freed = state.now
    state.telemetry.executed(task, worker, allocation, msg.thread, msg.duration, state.now, True)
    tally = task.group
    if tally is not None:
        old = tally.expected
        tally.expected = msg.duration if old is None else 0.5 * (old + msg.duration)
        size = tally.output
        tally.output = msg.nbytes if size is None else 0.5 * (size + msg.nbytes)
    state.placement_due = True
    if task.discard_result:
        settle_discarded(state, task, f"finished on {worker.name}, result discarded")
        return
    if task.actor and not actors.hold(worker, task, allocation):
        state.free_keys[worker.id].append(task.key)  # the object it built goes
        error = ("lost", actors.unheld_text(task, worker), b"")
        state.fail(task, error, "built while others held its resources")
        return
    state.complete(task, worker, msg.nbytes, f"finished on {worker.name}", msg.type_name)


def _allocation_of(state: SchedulerState, key: str) -> Allocation | None:
    task = state.tasks.get(key)
    return task.allocation if task is not None else None


def task_raised(state: SchedulerState, worker: WorkerRecord, msg: TaskRaised) -> None:
    allocation = _allocation_of(state, msg.key)
    task = running_task(state, worker, msg.key)
    if task is None:
        return
    worker.thread_freed = state.now
    state.telemetry.executed(task, worker, allocation, msg.thread, msg.duration, state.now, False)
    state.placement_due = True
    stopped = preemption.settle(state, worker, task.key)
    if task.discard_result:
        settle_discarded(state, task, f"raised on {worker.name}, result discarded")
    elif msg.interrupted and task.key in state.preemption.preemptible:
        # Stopped as preempted: not a failure, it runs again as a new attempt, its
        # retries untouched. The worker's word counts where no stop is known here:
        # a scheduler restarted since it asked for the stop has adopted the task.
        why = stopped.reason if stopped is not None else "asked before a scheduler restart"
        state.requeue(task, f"stopped on {worker.name} ({why}); queued again")
    elif task.retries > 0:
        # A stop under way that it did not wait for (it failed by itself before the
        # stop reached it) is settled above: this is its own failure.
        task.retries -= 1
        state.retried[task.key] = state.retried.get(task.key, 0) + 1
        state.raised_on.setdefault(task.key, []).append(worker.id)
        state.requeue(task, f"raised on {worker.name}; retrying ({task.retries} left)")
    else:
        state.fail(task, ("exception", msg.exception, msg.traceback), f"raised on {worker.name}")


def settle_discarded(state: SchedulerState, task: TaskRecord, cause: str) -> None:
    """A task whose result was dropped on purpose is back from its worker."""
    task.discard_result = False  # settled now: its worker no longer holds it
    if task.cancelled:
        task.cancelled = False
        error = task.error or ("cancelled", f"{task.key!r} was cancelled", b"")
        task.error = error  # before the move: telemetry counts by its kind
        state.move(task, ERRED, cause)
        state.finish_inputs(task)
        # Dependents submitted while it still ran did not fail with it: now they do.
        for dependent_key in list(task.dependents or ()):
            state.fail(state.tasks[dependent_key], error, f"input {task.key} failed")
        state.release_if_unneeded(task)
    elif task.needed():
        state.requeue(task, cause + "; needed again")
    elif task.lineage and task.func_id:
        state.keep_released(task, cause + "; kept to recompute what was computed from it")
    else:
        state.remove(task, cause)


def heartbeat(state: SchedulerState, worker: WorkerRecord, msg: Heartbeat) -> None:
    """Hearing from the worker is the point (``last_seen``); its memory dates a crash.

    A worker paused for its memory gets no new task; once it resumes, what waited
    may go there.
    """
    worker.memory = msg.memory
    worker.spilled = msg.spilled
    worker.cpu = msg.cpu
    worker.received = msg.received
    worker.sent = msg.sent
    paused = bool(msg.paused)
    if worker.paused and not paused:
        state.placement_due = True
    worker.paused = paused


def worker_closing(state: SchedulerState, worker: WorkerRecord, msg: WorkerClosing) -> None:
    worker.leaving = msg.reason or "closed"


def tasks_dropped(state: SchedulerState, worker: WorkerRecord, msg: TasksDropped) -> None:
    """The worker let go of tasks we had freed before they started: settle them."""
    for key in msg.keys:
        task = running_task(state, worker, key)
        if task is not None:
            state.placement_due = True
            preemption.settle(state, worker, key)
            settle_discarded(state, task, f"dropped by {worker.name} before it started")


def _drop_failed_holders(
    state: SchedulerState, dep: TaskRecord, tried: list[str], worker: WorkerRecord
) -> None:
    """The holders ``worker`` tried do not have ``dep``: forget them; lose it with the last."""
    for holder_id in holders(dep):
        holder = state.workers.get(holder_id)
        if holder is not None and holder.address not in tried:
            continue  # a copy made after the task was sent: still good
        if holder is not None:
            # Whatever the holder still has under that key is stale from now on.
            state.free_keys[holder.id].append(dep.key)
            if drop_holder(dep, holder):
                continue
            holder.has_what.discard(dep.key)
            holder.nbytes -= dep.nbytes
        state.lose_result(dep, f"{worker.name} could not fetch it")
        return


#: A task whose inputs could not be fetched this many times fails instead of looping.
MAX_FETCH_FAILURES = 3


def missing_dependency(state: SchedulerState, worker: WorkerRecord, msg: MissingDependency) -> None:
    task = running_task(state, worker, msg.key)
    if msg.reason:
        # The input exists but its value cannot travel: running again cannot help.
        if task is not None and task.state == PROCESSING and not task.discard_result:
            text = f"input {msg.dep!r} of {msg.key!r} cannot be sent to {worker.name}: {msg.reason}"
            state.fail(task, ("unserializable", text, b""), f"input {msg.dep} cannot be sent")
        elif task is not None and task.state == PROCESSING:
            settle_discarded(state, task, f"input {msg.dep} cannot be sent")
        state.placement_due = True
        return
    dep = state.tasks.get(msg.dep)
    if dep is not None and dep.state == MEMORY:
        _drop_failed_holders(state, dep, msg.holders, worker)
    if task is None or task.state != PROCESSING:
        return  # a stale report, or the task failed with the input it could not fetch
    state.placement_due = True
    cause = f"input {msg.dep} missing on {worker.name}"
    if task.discard_result:  # released or cancelled meanwhile: do not run it again
        settle_discarded(state, task, cause)
        return
    failures = state.fetch_failures.get(task.key, 0) + 1
    if failures >= MAX_FETCH_FAILURES:
        text = f"{task.key!r} could not fetch input {msg.dep!r} {failures} times"
        state.fail(task, ("lost", f"{text} (last on {worker.name})", b""), cause)
        return
    state.fetch_failures[task.key] = failures
    task.missing_deps = sum(1 for d in task.deps if state.tasks[d].state != MEMORY)
    state.requeue(task, cause)
