"""Requests no connected worker could ever hold: warn once, or fail where nothing can grow."""

from __future__ import annotations

from typing import Any

from apportion.core.ledger import splittable
from apportion.core.resources import describe_amount, describe_resources
from apportion.scheduler.core import SchedulerCore
from apportion.scheduler.events import NotifyClient
from apportion.scheduler.records import (
    QUEUED,
    QueueKey,
    Restriction,
    TaskRecord,
    options_of,
    restriction_of,
)


def satisfiable(state: SchedulerCore, signature: QueueKey) -> bool:
    """Some connected worker's declared supply could hold this request, and (for a
    hard restriction) that worker is one the task may run on."""
    known = state.satisfiable_cache.get(signature)
    if known is None:
        restriction = restriction_of(signature)
        known = any(
            w.ledger.could_hold(dict(option))
            and (restriction is None or restriction.loose or restriction.allows(w))
            for option in options_of(signature)
            for w in state.workers.values()
        )
        state.satisfiable_cache[signature] = known
    return known


def check_satisfiable(
    state: SchedulerCore, task: TaskRecord
) -> tuple[str, bytes | str, bytes] | None:
    """At submission, on a cluster that cannot grow: the failure to give ``task``."""
    if not state.config.fail_unsatisfiable or not state.workers:
        return None
    if satisfiable(state, task.signature):
        return None
    return ("unsatisfiable", unsatisfiable_text(task, state.workers.values()), b"")


def fail_or_warn(state: SchedulerCore, signature: QueueKey, heap: list[Any]) -> None:
    """Placement found ready tasks that no connected worker can ever hold."""
    if satisfiable(state, signature):
        return  # only workers that are closing could: wait for others, say nothing yet
    tasks = [state.tasks[key] for _, _, key in heap if key in state.tasks]
    tasks = [t for t in tasks if t.state == QUEUED]
    if not tasks:
        return
    text = unsatisfiable_text(tasks[0], state.workers.values())
    if not state.config.fail_unsatisfiable:
        warn_unsatisfiable(state, tasks[0], text)
        return
    for task in tasks:
        state.fail(task, ("unsatisfiable", text, b""), "no connected worker can run it")


def warn_unsatisfiable(state: SchedulerCore, task: TaskRecord, text: str) -> None:
    """Log it once per kind of request, and tell each client waiting for one once."""
    if task.signature not in state.warned:
        state.warned.add(task.signature)
        state.warn(text)
    for client_id in task.wanted_by or ():
        if (client_id, task.signature) not in state.notified:
            state.notified.add((client_id, task.signature))
            state.emit(NotifyClient(client_id, "warning", text))


def unsatisfiable_text(task: TaskRecord, workers: Any) -> str:
    """Name what is missing and the largest supply on offer, for a warning or an error."""
    workers = list(workers)
    restriction = task.restriction
    if restriction is not None and not restriction.loose:
        return _restricted_text(task, restriction, workers)
    if not task.variants:
        return (
            f"task {task.key!r} needs {describe_resources(task.resources)}, which no connected "
            f"worker can ever provide: {_shortfall(task.resources, workers)}"
        )
    options = "; ".join(
        f"{describe_resources(v) or 'nothing'} ({_shortfall(v, workers)})" for v in task.variants
    )
    return (
        f"task {task.key!r} gives {len(task.variants)} alternatives and no connected worker "
        f"can ever provide any of them: {options}"
    )


def _restricted_text(task: TaskRecord, restriction: Restriction, workers: list[Any]) -> str:
    """A hard restriction no connected worker meets: none of the named is connected,
    or those that are could never hold the demand."""
    where = f"task {task.key!r} may run only on workers matching {restriction.describe()}"
    allowed = [w for w in workers if restriction.allows(w)]
    if not allowed:
        connected = ", ".join(sorted(w.name for w in workers)[:10]) or "none"
        return (
            f"{where} (workers=), and no connected worker matches (connected: {connected}); "
            "pass allow_other_workers=True to let others run it"
        )
    names = ", ".join(sorted(w.name for w in allowed))
    options = task.variants or (task.resources,)
    shortfalls = "; ".join(
        f"{describe_resources(v) or 'nothing'} ({_shortfall(v, allowed)})" for v in options
    )
    return f"{where} ({names}), and none of them can ever provide what it needs: {shortfalls}"


def _shortfall(demand: dict[str, int], workers: list[Any]) -> str:
    names = sorted(demand)
    best: dict[str, tuple[int, str]] = {}
    for w in workers:
        for name in names:
            have = w.ledger.total.get(name, 0)
            if name not in best or have > best[name][0]:
                best[name] = (have, w.name)
    short: set[str] = set()
    for w in workers:
        short.update(w.ledger.missing(demand))
    parts = []
    for name in names:
        have, where = best.get(name, (0, ""))
        if name in short:
            if have:
                parts.append(f"largest {name} supply is {describe_amount(name, have)} on {where}")
            else:
                parts.append(f"no worker offers {name}")
    for name in names:
        need = demand[name]
        if not splittable(need) and any(name in w.ledger.units for w in workers):
            parts.append(
                f"{name} is an indexed pool: ask for whole units, or at most 1 to share one "
                f"unit, not {describe_amount(name, need)}"
            )
    return "; ".join(parts) or "no single worker offers all of it"
