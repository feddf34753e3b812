"""Plain-language answers to "why is this task not running?"."""

from __future__ import annotations

from apportion.core.demand import PLAIN
from apportion.core.ledger import describe_units
from apportion.core.resources import describe_amount, describe_resources
from apportion.scheduler.placement import held_back, holder_of, makes_new_data, pools
from apportion.scheduler.records import (
    ERRED,
    MEMORY,
    PROCESSING,
    QUEUED,
    WAITING,
    TaskRecord,
    WorkerRecord,
    kind_of,
    share_of,
)
from apportion.scheduler.shares import quota_note
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.unsatisfiable import unsatisfiable_text


def unknown_text(key: str) -> str:
    """The answer for a key the scheduler does not know (the CLI tells it apart by it)."""
    return f"{key!r} is not known to the scheduler: never submitted, or already released"


def explain(state: SchedulerState, key: str) -> str:
    """One paragraph on where ``key`` stands and what it waits for."""
    task = state.tasks.get(key)
    if task is None:
        return unknown_text(key)
    if task.state == WAITING:
        pending = [d for d in task.deps if state.tasks[d].state != MEMORY]
        shown = ", ".join(repr(d) for d in pending[:5]) + (" ..." if len(pending) > 5 else "")
        return f"waiting for {len(pending)} of its {len(task.deps)} inputs: {shown}"
    if task.state == PROCESSING:
        worker = state.workers.get(task.worker or "")
        where = f"{worker.name} ({worker.address})" if worker else "a worker"
        holding = f", holding {describe_resources(task.resources)}" if task.resources else ""
        if task.allocation is not None and task.allocation.units:
            holding += f" (units: {describe_units(task.allocation.units)})"
        if worker is None:
            return f"running on {where}{holding}"
        return _assigned(state, task, worker, where + holding)
    if task.state == MEMORY:
        worker = state.workers.get(task.worker or "")
        return f"finished; its result is on {worker.name if worker else 'a worker'}"
    if task.state == ERRED and task.error is not None:
        kind, detail, _ = task.error
        text = detail if isinstance(detail, str) else "the task raised an exception"
        return f"failed ({kind}): {text}"
    ahead = sum(
        1
        for _, _, k in state.ready.get(task.queue, ())
        if k in state.tasks
        and state.tasks[k].state == QUEUED
        and state.tasks[k].order() < task.order()
    )
    return why_queued(state, task, ahead) + _retry_note(state, task)


def _retry_note(state: SchedulerState, task: TaskRecord) -> str:
    """For a task retried after raising: where it raised, which it avoids."""
    raised = state.raised_on.get(task.key) if state.raised_on else None
    if not raised:
        return ""
    counts = {w: raised.count(w) for w in dict.fromkeys(raised)}
    where = ", ".join(
        f"{state.workers[w].name if w in state.workers else 'a worker that has left'}"
        + (f" ({n} times)" if n > 1 else "")
        for w, n in counts.items()
    )
    return (
        f"\n  it raised on {where}: it goes first to a worker where it raised less "
        "often, and runs there again only if no other can take it now"
    )


def _assigned(state: SchedulerState, task: TaskRecord, worker: WorkerRecord, where: str) -> str:
    """Where a PROCESSING task is: running, perhaps waiting in its worker's queue, or
    on its way to an idle worker (``stealing``)."""
    steal = state.steals.get(task.key)
    if steal is not None:
        thief = state.workers.get(steal[1])
        idle = thief.name if thief is not None else "a worker that has left"
        return (
            f"assigned to {where}; being moved to idle {idle}: {worker.name} was asked "
            "to let it go if it has not started"
        )
    if task.key in worker.started or worker.running() <= worker.nthreads:
        return f"running on {where}"
    return (
        f"assigned to {where}: running, or waiting there behind other tasks "
        f"({worker.running()} for its {worker.nthreads} threads); it moves to a worker "
        "whose thread idles first, if it would start sooner there"
    )


def _held_anyway(state: SchedulerState, task: TaskRecord) -> str | None:
    """What holds a QUEUED task wherever it could fit: no workers, or its share's quota."""
    if not state.workers:
        return "queued: no workers are connected"
    if state.shares.quotas:
        return quota_note(state.shares, state.workers, state.tasks, task)
    return None


def why_queued(state: SchedulerState, task: TaskRecord, ahead: int = 0) -> str:
    """Why QUEUED ``task`` does not start, ``ahead`` older tasks of its kind before it.

    Without ``ahead``, the answer for the first of its kind (what the status lists),
    at no cost per queued task."""
    held = _held_anyway(state, task)
    if held is not None:
        return held
    queue = f" ({ahead} older ready tasks with the same request are ahead of it)" if ahead else ""
    if kind_of(task.queue) == PLAIN:
        slots = sum(w.nthreads for w in state.workers.values())
        busy = sum(w.running() for w in state.workers.values())
        paused = [w.name for w in state.workers.values() if w.paused]
        if paused:
            names = ", ".join(paused[:5]) + (" ..." if len(paused) > 5 else "")
            if len(paused) == len(state.workers):
                return f"queued: every worker is paused for its memory ({names}){queue}"
            return (
                f"queued: {len(paused)} of {len(state.workers)} workers are paused for "
                f"their memory ({names}) and the others' threads are busy ({busy} tasks "
                f"running or queued on them){queue}"
            )
        root = (
            "; it makes new data (no inputs, feeds other tasks), so it starts only as "
            "a thread frees up"
            if makes_new_data(state, task)
            else ""
        )
        return (
            f"queued: all {slots} threads on {len(state.workers)} workers are busy "
            f"({busy} tasks running or queued on them){queue}{root}"
        )
    options = task.demand.alternatives
    by_option = pools(state, task.queue)
    if not any(by_option):
        return "queued: " + unsatisfiable_text(task, state.workers.values())
    if len(options) == 1:
        need = describe_resources(task.resources) or "a free thread"
        lines = [f"queued: needs {need}{queue}"]
    else:
        lines = [f"queued: none of its {len(options)} alternatives fits anywhere now{queue}"]
    if task.restriction is not None:
        lines.append("  " + _restriction_note(task, by_option))
    for amounts, pool in zip(options, by_option, strict=True):
        if len(options) > 1:
            lines.append(f"  {describe_resources(amounts) or 'no resources'}:")
        for worker in pool:
            why_not = _worker_obstacles(state, worker, task, amounts)
            lines.append(f"{'    ' if len(options) > 1 else '  '}{worker.name}: {why_not}")
    if task.reserved_on is not None and task.reserved_on in state.workers:
        name = state.workers[task.reserved_on].name
        lines.append(
            f"  it holds the reservation on {name}: what running tasks free there is kept "
            "for it, so newer tasks cannot overtake it"
        )
        lines.extend(_stops_for(state, task))
    return "\n".join(lines)


def _stops_for(state: SchedulerState, task: TaskRecord) -> list[str]:
    """The line on preemptible tasks being stopped where ``task`` holds its reservation
    to let its share in (``preemption.py``); none if none."""
    stopped = sorted(
        key
        for key, stop in state.preemption.stopping.items()
        if stop.worker_id == task.reserved_on and stop.for_share == share_of(task.queue)
    )
    if not stopped:
        return []
    return [f"  preemptible {', '.join(stopped)} being stopped there to make room"]


def _restriction_note(task: TaskRecord, by_option: list[list[WorkerRecord]]) -> str:
    """Where a restricted task may run, and whether a loose one has fallen back."""
    restriction = task.restriction
    assert restriction is not None
    named = restriction.describe()
    if not restriction.loose:
        return f"it may run only on workers matching {named} (workers=); those are:"
    if any(restriction.allows(w) for pool in by_option for w in pool):
        return (
            f"it prefers workers matching {named} (allow_other_workers): it waits for "
            "them while one of them could run it; those are:"
        )
    return (
        f"it prefers workers matching {named} (allow_other_workers), but none connected "
        "could ever run it, so any worker may:"
    )


def _worker_obstacles(
    state: SchedulerState, worker: WorkerRecord, task: TaskRecord, demand: dict[str, int]
) -> str:
    reasons = []
    holder = holder_of(state, worker, task)
    kept = held_back(state, worker, task)
    ledger = worker.ledger
    for name, need in sorted(demand.items()):
        free = ledger.available(name, kept)
        if free < need:
            reasons.append(
                f"{name} {describe_amount(name, free)} of "
                f"{describe_amount(name, ledger.total[name])} free"
            )
        elif not ledger.has_unit_room(name, need):
            unit_free = ", ".join(
                f"{label}: {describe_amount(name, left)}"
                for label, left in ledger.units[name].items()
            )
            reasons.append(f"{name} has no unit with room for it (free per unit: {unit_free})")
    if worker.paused:
        reasons.append("paused for its memory")
    if worker.running() >= worker.nthreads:
        reasons.append(f"all {worker.nthreads} threads busy")
    if holder is not None:
        reasons.append(_reserved_for(state, holder, task))
    return "; ".join(reasons) if reasons else "fits now; starts in the next placement pass"


def _reserved_for(state: SchedulerState, holder: TaskRecord, task: TaskRecord) -> str:
    """Who holds a worker's reservation, and how it stands to ``task`` in the queue.

    Tasks are ordered by priority, then by when the scheduler was given them. The
    holder may be behind ``task``: when ``task`` holds a reservation of its own (on
    another worker), or is not the oldest of its kind (that one takes reservations
    over, ``placement._reserve``).
    """
    needs = describe_resources(holder.resources)
    theirs = share_of(holder.queue)
    if theirs != share_of(task.queue):
        return (
            f"reserved for task {holder.key!r} of share {theirs!r} (needs {needs}): this "
            "task's share may take what it keeps only while further below its fair share"
        )
    if holder.order() < task.order():
        if holder.priority > task.priority:
            return f"reserved for task {holder.key!r} of higher priority (needs {needs})"
        return f"reserved for older task {holder.key!r} (needs {needs})"
    mine = state.workers.get(task.reserved_on or "")
    if mine is not None:
        where = f"this task holds its own reservation on {mine.name}"
    else:
        where = "it keeps it until it starts, or an older blocked task takes it over"
    how = "of lower priority" if holder.priority < task.priority else "submitted after this one"
    return f"reserved for task {holder.key!r} {how} (needs {needs}); {where}"
