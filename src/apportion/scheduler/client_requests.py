"""Client requests: submitting tasks, wanting and releasing keys, cancelling, asking.

Functions over ``SchedulerState``; ``state.py`` dispatches each client message here.
"""

from __future__ import annotations

import sys
from typing import Any

from apportion.core.demand import PLAIN, Demand, from_wire
from apportion.protocol.cluster import (
    BacklogReply,
    BacklogRequest,
    CheckDemands,
    DemandsChecked,
    DumpReply,
    DumpRequest,
    InfoReply,
    InfoRequest,
    StatusReply,
    StatusRequest,
    StoryReply,
    StoryRequest,
    WhyReply,
    WhyRequest,
)
from apportion.protocol.tasks import CancelKeys, ReleaseKeys, SubmitTasks, TaskSpec
from apportion.scheduler import records, views
from apportion.scheduler.backlog import backlog
from apportion.scheduler.events import SendKeysFailed, TaskError, failure_notice
from apportion.scheduler.explain import explain
from apportion.scheduler.people_view import narrow_status
from apportion.scheduler.records import (
    ERRED,
    MEMORY,
    NEW,
    PROCESSING,
    QUEUED,
    RELEASED,
    WAITING,
    ClientRecord,
    Restriction,
    Shared,
    TaskRecord,
    add_dependent,
    kind_of,
    unwant,
)
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.status import status
from apportion.scheduler.telemetry import STREAM_SIZE
from apportion.scheduler.unsatisfiable import (
    check_demand,
    check_satisfiable,
    satisfiable,
    unsatisfiable_text,
    warn_unsatisfiable,
)

#: ``why`` with no keys explains at most this many tasks that are not running.
WHY_ALL_LIMIT = 100


def submit(state: SchedulerState, client: ClientRecord, msg: SubmitTasks) -> None:
    # Records, links and wants first, states second: a task that fails at
    # submission must already know who wants it and which dependents fail with
    # it, or it would be forgotten unseen and reported only as "unknown".
    created: list[TaskRecord] = []
    # One Restriction object per distinct restriction in the batch, not one per task.
    restrictions: dict[tuple[tuple[str, ...], int], Restriction] = {}
    demands: dict[Any, Demand] = {}
    for spec in msg.tasks:
        existing = state.tasks.get(spec.key)
        wanters: frozenset[str] | None = None
        if existing is not None and _was_cancelled(existing):
            wanters = existing.wanted_by
            existing = _revive(state, existing)
        if existing is None:
            task = _new_task(state, client, spec, restrictions, demands)
            _belongs(task, client, spec)
            task.wanted_by = wanters or None  # their futures still exist
            created.append(task)
    # After the loop above: dropping a revived record may have dropped its function.
    state.functions.update(msg.functions)
    for task in created:  # after creation, so a batch need not be in graph order
        _link_inputs(state, task)
    for key in msg.wanted:
        want(state, client, key)
    for task in created:
        if task.state == NEW:  # not already failed with an input
            _start(state, task)
    # Tasks nobody wants and nothing depends on would run for no one.
    for task in reversed(created):
        if task.key in state.tasks:
            state.release_if_unneeded(task)
    # New tasks, and existing ones this client now waits for too, get the warning.
    asked = [state.tasks[key] for key in msg.wanted if key in state.tasks]
    for task in (*created, *asked):
        if (
            (task.demand.asks or task.restriction)
            and task.state in (WAITING, QUEUED)
            and state.workers
        ):
            _warn_if_unsatisfiable(state, task)


def _was_cancelled(task: TaskRecord) -> bool:
    return (
        task.error is not None
        and task.error[0] == "cancelled"
        and (task.state == ERRED or task.cancelled)
    )


def _revive(state: SchedulerState, task: TaskRecord) -> TaskRecord | None:
    """A cancelled key submitted again runs again, as a new task would.

    A finished cancellation is dropped so the submission creates a fresh record; one
    still running keeps its record but loses its cancellation, so that the worker's
    report re-queues it ("needed again") instead of failing it.
    """
    if task.state == ERRED:
        state.remove(task, "submitted again after a cancel")
        return None
    task.cancelled = False
    task.error = None
    return task


def _link_inputs(state: SchedulerState, task: TaskRecord) -> None:
    for dep_key in task.deps:
        dep = state.tasks.get(dep_key)
        if dep is not None:
            add_dependent(dep, task.key)
            dep.lineage += 1


def _warn_if_unsatisfiable(state: SchedulerState, task: TaskRecord) -> None:
    if not satisfiable(state, task.queue):
        warn_unsatisfiable(state, task, unsatisfiable_text(task, state.workers.values()))


def _belongs(task: TaskRecord, client: ClientRecord, spec: TaskSpec) -> None:
    """Whose ``task`` is: a person's tasks are theirs, and the owner's service (the job
    queue) may submit for a person, whose share its run then belongs to."""
    task.person = client.person or (sys.intern(spec.person) if spec.person else "")
    if task.person and task.person != client.share:
        task.queue = Shared(kind_of(task.queue), task.person)


def _new_task(
    state: SchedulerState,
    client: ClientRecord,
    spec: TaskSpec,
    restrictions: dict[tuple[tuple[str, ...], int], Restriction],
    demands: dict[Any, Demand],
) -> TaskRecord:
    """A NEW record; ``submit`` links it to its inputs and ``_start`` sets its state.

    Its ``Demand`` is made once per distinct request in a batch (``demands``), so the
    10,000 tasks of a ``map`` share one, as they share one restriction.
    """
    if spec.resources or spec.alternatives:
        wire = (
            tuple(spec.resources.items()),
            tuple(tuple(a.items()) for a in spec.alternatives),
        )
        demand = demands.get(wire)
        if demand is None:
            demand = demands[wire] = from_wire(spec.resources, spec.alternatives)
    else:
        demand = PLAIN
    restriction: Restriction | None = None
    if spec.workers:
        shape = (tuple(spec.workers), spec.allow_other_workers)
        restriction = restrictions.get(shape)
        if restriction is None:
            restriction = Restriction(frozenset(spec.workers), bool(spec.allow_other_workers))
            restrictions[shape] = restriction
    task = TaskRecord(
        spec.key,
        # One string per function, not one per task: each decoded spec brings its own.
        sys.intern(spec.func_id),
        spec.args,
        tuple(spec.deps),
        demand,
        spec.priority,
        spec.retries,
        state.next_seq(),
        restriction,
    )
    task.actor = bool(spec.actor)
    if spec.preemptible and client.durable:
        # Only a service's tasks (the job queue's command runs) may be stopped and run
        # again; a Python task's work would simply be lost, so a client's flag is ignored.
        state.preemption.preemptible.add(spec.key)
    # The submitter's share: its tasks queue apart from other shares' (``shares.py``).
    task.queue = client.queue_key(kind_of(task.queue))
    state.tasks[spec.key] = task
    state.function_users[spec.func_id] += 1
    return task


def _start(state: SchedulerState, task: TaskRecord) -> None:
    """Move a new task to WAITING, QUEUED or (bad input, unsatisfiable) ERRED."""
    failure: TaskError | None = None
    for dep_key in task.deps:
        dep = state.tasks.get(dep_key)
        if dep is None:
            text = f"input {dep_key!r} of {task.key!r} is unknown (already released?)"
            failure = ("lost", text, b"")
        elif dep.state == ERRED and dep.error is not None:
            failure = dep.error
        elif dep.state == RELEASED:
            state.recompute(dep, f"needed again by {task.key}")
            if task.state != NEW:
                return  # the input could not be recomputed and failed it too
            task.missing_deps += 1
        elif dep.state != MEMORY:
            task.missing_deps += 1
    if failure is None and (task.demand.asks or task.restriction):
        failure = check_satisfiable(state, task)
    cause = "submitted"
    if task.restriction is not None:
        kind = "preferring" if task.restriction.loose else "restricted to"
        cause += f", {kind} workers {task.restriction.describe()}"
    if failure is not None:
        state.fail(task, failure, cause)
    elif task.missing_deps:
        state.move(task, WAITING, cause)
    else:
        state.enqueue(task, cause)


def want(state: SchedulerState, client: ClientRecord, key: str) -> None:
    task = state.tasks.get(key)
    if task is None:
        state.emit(SendKeysFailed(client.id, [key], "lost", f"{key!r} is unknown"))
        return
    records.want(task, client)
    # The record's own string: ``key`` came in a list of its own, and keeping it here
    # would hold a second copy of every key a client wants.
    key = task.key
    client.wanted.add(key)
    if task.state == MEMORY:
        state.done_keys[client.id].append(key)
    elif task.state == RELEASED:
        state.recompute(task, f"wanted again by client {client.id}")
    elif (task.state == ERRED or task.cancelled) and task.error is not None:
        state.emit(failure_notice(client.id, key, task.error, state.retried.get(key, 0) + 1))


def release(state: SchedulerState, client: ClientRecord, keys: list[str]) -> None:
    for key in keys:
        client.wanted.discard(key)
        task = state.tasks.get(key)
        if task is not None and task.wanted_by:
            unwant(task, client.id)
            state.release_if_unneeded(task)


def release_keys(state: SchedulerState, client: ClientRecord, msg: ReleaseKeys) -> None:
    release(state, client, msg.keys)


def cancel_keys(state: SchedulerState, client: ClientRecord, msg: CancelKeys) -> None:
    if state.relays.parked:
        state.relays.drop_parked(client.id, msg.keys)
    for key in msg.keys:
        task = state.tasks.get(key)
        if task is None or task.state not in (WAITING, QUEUED, PROCESSING):
            continue
        text = f"{key!r} was cancelled"
        state.fail(task, ("cancelled", text, b""), f"cancelled by client {client.id}")


def why(state: SchedulerState, client: ClientRecord, msg: WhyRequest) -> None:

    keys = (
        msg.keys
        or [key for key, task in state.tasks.items() if task.state in (WAITING, QUEUED)][
            :WHY_ALL_LIMIT
        ]
    )
    reasons = {key: explain(state, key) for key in keys}
    state.reply(client.id, WhyReply(msg.request_id, reasons))


def info(state: SchedulerState, client: ClientRecord, msg: InfoRequest) -> None:
    state.reply(client.id, InfoReply(msg.request_id, views.snapshot(state)))


def check_demands(state: SchedulerState, client: ClientRecord, msg: CheckDemands) -> None:
    verdicts = [list(check_demand(state, demand)) for demand in msg.demands]
    state.reply(client.id, DemandsChecked(msg.request_id, verdicts))


def waiting_work(state: SchedulerState, client: ClientRecord, msg: BacklogRequest) -> None:
    queued, workers = backlog(state)
    state.reply(client.id, BacklogReply(msg.request_id, queued, workers))


def cluster_status(state: SchedulerState, client: ClientRecord, msg: StatusRequest) -> None:
    limit = max(0, min(msg.stream_limit, STREAM_SIZE))
    built = status(
        state,
        stream_since=msg.stream_since,
        events_since=msg.events_since,
        stream_limit=limit,
        asking=client.id,  # ``apportion status`` is not one of the clients it shows
    )
    if client.person:  # a person sees their own work, and everyone's totals
        built = narrow_status(state, client.person, built)
    state.reply(client.id, StatusReply(msg.request_id, built))


def story(state: SchedulerState, client: ClientRecord, msg: StoryRequest) -> None:
    rows: list[list[Any]] = [list(row) for row in state.story(msg.key)]
    state.reply(client.id, StoryReply(msg.request_id, rows))


def dump(state: SchedulerState, client: ClientRecord, msg: DumpRequest) -> None:
    state.reply(client.id, DumpReply(msg.request_id, views.dump(state)))
