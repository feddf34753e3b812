"""Requests no connected worker could ever hold: warn once, or fail where nothing can grow.

A request that names a resource no worker offers, where one offers a name differing
only in case or by a typo (``gpu`` or ``GUP`` beside ``GPU``), fails at once on any
cluster: waiting for a worker that offers the misspelt name would most likely be
waiting forever, and the user learns of the slip at submission instead of wondering
why nothing starts (``core.resource_names`` says what counts as a slip).

A task that uses actors as inputs is held to the same rule with their resources
taken out of each worker's supply: they are held while the task waits for them, so a
request that fits only where they stand can never start (``pinned_by_inputs``). A
task waiting for any other actor is not stuck: its client may release that one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apportion.core.demand import Demand
from apportion.core.ledger import Ledger, splittable
from apportion.core.resource_names import did_you_mean, misspelt, suggestions
from apportion.core.resources import Amounts, describe_amount, describe_resources
from apportion.scheduler.events import SendNotice
from apportion.scheduler.records import (
    QUEUED,
    QueueKey,
    Restriction,
    TaskRecord,
    WorkerRecord,
    demand_of,
    kind_of,
    restriction_of,
)
from apportion.scheduler.state import SchedulerState


def satisfiable(state: SchedulerState, key: QueueKey) -> bool:
    """Some connected worker's declared supply could hold this request, and (for a
    hard restriction) that worker is one the task may run on."""
    key = kind_of(key)  # whoever's share: the answer is the kind's
    known = state.satisfiable_cache.get(key)
    if known is None:
        restriction = restriction_of(key)
        known = any(
            w.ledger.could_hold(amounts)
            and (restriction is None or restriction.loose or restriction.allows(w))
            for amounts in demand_of(key).alternatives
            for w in state.workers.values()
        )
        state.satisfiable_cache[key] = known
    return known


def check_satisfiable(
    state: SchedulerState, task: TaskRecord
) -> tuple[str, bytes | str, bytes] | None:
    """At submission: the failure to give ``task`` if it names a misspelt resource, or
    (on a cluster that cannot grow) if no connected worker could ever hold it."""
    if not state.workers or satisfiable(state, task.queue):
        return None
    slips = misnamed(state, task)
    if slips:
        return ("misnamed", misnamed_text(task, slips, state.workers.values()), b"")
    if not state.config.fail_unsatisfiable:
        return None
    return ("unsatisfiable", unsatisfiable_text(task, state.workers.values()), b"")


def fail_or_warn(state: SchedulerState, kind: QueueKey, heap: list[Any]) -> None:
    """Placement found ready tasks that no connected worker can ever hold."""
    if satisfiable(state, kind):
        return  # only workers that are closing could: wait for others, say nothing yet
    tasks = [state.tasks[key] for _, _, key in heap if key in state.tasks]
    tasks = [t for t in tasks if t.state == QUEUED]
    if not tasks:
        return
    slips = misnamed(state, tasks[0])
    if slips:  # submitted before a worker was connected to say what it offers
        for task in tasks:
            text = misnamed_text(task, slips, state.workers.values())
            state.fail(task, ("misnamed", text, b""), "it names a resource no worker offers")
        return
    text = unsatisfiable_text(tasks[0], state.workers.values())
    if not state.config.fail_unsatisfiable:
        warn_unsatisfiable(state, tasks[0], text)
        return
    for task in tasks:
        state.fail(task, ("unsatisfiable", text, b""), "no connected worker can run it")


def pinned_by_inputs(
    state: SchedulerState, task: TaskRecord, pools: list[list[WorkerRecord]]
) -> str:
    """Whether ``task`` can never start because actors hold what it needs until it
    ends: actors among its own inputs, or among the inputs of a task that waits for
    it (directly or not), hold their resources while their results are needed, so
    at least until ``task`` ends. Then the actors' keys (a GPU=2 request using an
    actor that holds 3 of the only 4 GPUs; a GPU=1 task whose result goes, with a
    GPU=1 actor's on the only GPU, to one task); else ``""``. ``pools``: per demand,
    the workers that could ever hold it when idle (``placement.pools``)."""
    if not any(w.actors for pool in pools for w in pool):
        return ""  # the usual case, and cheap: no actor holds anything there
    held: dict[str, list[TaskRecord]] = {}
    for user in _with_waiters(state, task):
        for dep in user.deps:
            record = state.tasks[dep]
            allocation = record.allocation
            if record.actor and record.worker and allocation is not None and allocation.resources:
                held.setdefault(record.worker, []).append(record)
    if not held:
        return ""
    for amounts, pool in zip(task.demand.alternatives, pools, strict=True):
        for worker in pool:
            idle = Ledger(worker.ledger.total, {n: list(u) for n, u in worker.ledger.units.items()})
            for actor in held.get(worker.id, ()):
                assert actor.allocation is not None
                idle.take_exactly(actor.allocation.resources, actor.allocation.units)
            if idle.can_take(amounts, None):
                return ""  # it fits there once everything but its inputs ends
    return ", ".join(repr(a.key) for actors in held.values() for a in actors)


def _with_waiters(state: SchedulerState, task: TaskRecord) -> list[TaskRecord]:
    """``task`` and every unfinished task that waits for its result, directly or not."""
    found = {task.key: task}
    stack = [task]
    while stack:
        for key in stack.pop().dependents or ():
            if key not in found:
                found[key] = state.tasks[key]
                stack.append(found[key])
    return list(found.values())


def fail_or_warn_pinned(state: SchedulerState, task: TaskRecord, actors: str) -> None:
    """``task`` waits for what actors hold until it ends (``pinned_by_inputs``)."""
    state.drop_reservation(task)  # it could never use one: newer work may have it
    what = describe_resources(task.resources)
    text = (
        f"task {task.key!r} needs {what}, which no connected worker can ever provide "
        f"beside what actors hold ({actors}) for as long as this task's result is "
        "awaited: they are inputs of this task or of a task that waits for it"
    )
    if not state.config.fail_unsatisfiable:
        warn_unsatisfiable(state, task, text)
        return
    state.fail(task, ("unsatisfiable", text, b""), "its input actors hold what it needs")


def offered(workers: Iterable[WorkerRecord]) -> set[str]:
    """Every resource name some of ``workers`` offers."""
    return {name for w in workers for name in w.ledger.total}


def misnamed(state: SchedulerState, task: TaskRecord) -> dict[str, str]:
    """The names ``task`` asks for (in any of its alternatives) that no connected
    worker offers but are slips of one that some worker does: each with its
    suggestion. Once per kind of request, as a sweep of 10,000 shares the answer."""
    kind = kind_of(task.queue)
    known = state.misnamed_cache.get(kind)
    if known is None:
        asked = {name for amounts in task.demand.alternatives for name in amounts}
        known = state.misnamed_cache[kind] = misspelt(asked, offered(state.workers.values()))
    return known


def misnamed_text(task: TaskRecord, slips: dict[str, str], workers: Iterable[WorkerRecord]) -> str:
    """Why ``task`` fails at submission: the names no worker offers, the suggestion,
    and what is offered."""
    asks = "; ".join(describe_resources(v) or "nothing" for v in task.demand.alternatives)
    return f"task {task.key!r} asks for {asks}, but {misnamed_detail(slips, workers)}"


def misnamed_detail(slips: dict[str, str], workers: Iterable[WorkerRecord]) -> str:
    """``no connected worker offers gpu: did you mean GPU (not gpu)? (the workers
    offer GPU=2 on w1)``."""
    return (
        f"no connected worker offers {', '.join(slips)}: {did_you_mean(slips)} "
        f"(the workers offer {_offer_text(workers)})"
    )


def check_demand(state: SchedulerState, demand: Amounts) -> tuple[str, str]:
    """Whether the connected workers could ever hold ``demand`` (a run's, before it is
    queued): ``("", "")`` if one could; else a kind and what the asker should be told
    after what it asks (``"run 9 asks for gpu=1, but " + text``). Kinds: ``"no
    workers"`` (none connected: it waits for one), ``"misnamed"`` (a slip of an
    offered name) and ``"unsatisfiable"`` (no connected worker could ever hold it,
    though one that can may join later)."""
    if not state.workers:
        return "no workers", "no worker is connected yet: it waits for one"
    if satisfiable(state, Demand((demand,))):
        return "", ""
    workers = list(state.workers.values())
    slips = misspelt(demand, offered(workers))
    if slips:
        return "misnamed", misnamed_detail(slips, workers)
    return "unsatisfiable", (
        f"no connected worker can ever provide it: {_shortfall(demand, workers)} "
        f"(the workers offer {_offer_text(workers)})"
    )


def _offer_text(workers: Iterable[WorkerRecord]) -> str:
    """The largest amount of each offered pool, with a worker offering it."""
    best: dict[str, tuple[int, str]] = {}
    for w in workers:
        for name, have in w.ledger.total.items():
            if name not in best or have > best[name][0]:
                best[name] = (have, w.name)
    if not best:
        return "no resources"
    return ", ".join(
        f"{name}={describe_amount(name, have)} on {where}"
        for name, (have, where) in sorted(best.items())
    )


def warn_unsatisfiable(state: SchedulerState, task: TaskRecord, text: str) -> None:
    """Log it once per kind of request, and tell each client waiting for one once."""
    kind = kind_of(task.queue)  # once per kind, whichever shares ask for it
    if kind not in state.warned:
        state.warned.add(kind)
        state.warn(text)
    for client_id in task.wanted_by or ():
        if (client_id, kind) not in state.notified:
            state.notified.add((client_id, kind))
            state.emit(SendNotice(client_id, "warning", text))


def unsatisfiable_text(task: TaskRecord, workers: Any) -> str:
    """Name what is missing and the largest supply on offer, for a warning or an error."""
    workers = list(workers)
    restriction = task.restriction
    if restriction is not None and not restriction.loose:
        return _restricted_text(task, restriction, workers)
    alternatives = task.demand.alternatives
    if len(alternatives) == 1:
        return (
            f"task {task.key!r} needs {describe_resources(alternatives[0])}, which no "
            f"connected worker can ever provide: {_shortfall(alternatives[0], workers)}"
        )
    options = "; ".join(
        f"{describe_resources(v) or 'nothing'} ({_shortfall(v, workers)})" for v in alternatives
    )
    return (
        f"task {task.key!r} gives {len(alternatives)} alternatives and no connected worker "
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
    shortfalls = "; ".join(
        f"{describe_resources(v) or 'nothing'} ({_shortfall(v, allowed)})"
        for v in task.demand.alternatives
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
                # Not a slip (that fails at once), but maybe still what was meant.
                guess = did_you_mean(suggestions([name], offered(workers)))
                parts.append(f"no worker offers {name}" + (f" ({guess})" if guess else ""))
    for name in names:
        need = demand[name]
        if not splittable(need) and any(name in w.ledger.units for w in workers):
            parts.append(
                f"{name} is an indexed pool: ask for whole units, or at most 1 to share one "
                f"unit, not {describe_amount(name, need)}"
            )
    return "; ".join(parts) or "no single worker offers all of it"
