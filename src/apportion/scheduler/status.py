"""The cluster's status as plain data: what the dashboard draws, ``apportion status``
prints, ``/metrics`` exports and ``performance_report`` saves.

Read-only over the core's records, like ``views``: the views read this snapshot,
never the live records. It costs nothing per queued task (the counts come from
``telemetry``; the queue is read one kind of request at a time, from the head of
each), so it can be built every second with 100,000 tasks queued. What it lists
is bounded: every worker, the running tasks on each, up to ``MAX_GROUPS`` groups,
``MAX_KINDS`` kinds of waiting request, and the task stream and warnings after the
numbers the caller last saw.

Amounts are plain numbers (``0.5`` of a GPU), as ``scheduler_info()`` gives them;
times are the scheduler's clock (seconds), to be read against ``now``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from apportion.core.resources import SCALE, describe_resources, from_ticks, is_byte_pool
from apportion.scheduler.explain import why_queued
from apportion.scheduler.records import (
    DURATION_BUCKETS,
    LIVE_STATES,
    QUEUED,
    GroupTally,
    Histogram,
    QueueKey,
    TaskRecord,
    WorkerRecord,
    demand_of,
    restriction_of,
)
from apportion.scheduler.share_status import share_rows
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.unsatisfiable import satisfiable

#: Shape of the status; bumped when a field changes meaning or goes.
STATUS_VERSION = 1
#: Task groups listed, live ones first (most records first), then finished ones.
MAX_GROUPS = 200
#: Kinds of waiting request listed, oldest first.
MAX_KINDS = 100
#: Running tasks listed per worker.
MAX_RUNNING = 64
#: Executions of the task stream sent at most in one status.
STREAM_LIMIT = 5_000


def status(
    state: SchedulerState,
    *,
    stream_since: int = 0,
    events_since: int = 0,
    stream_limit: int = STREAM_LIMIT,
    asking: str | None = None,
) -> dict[str, Any]:
    """The cluster now, with the executions and warnings after the given numbers.

    Keys: ``version``; ``now`` (scheduler clock); ``scheduler`` (``id``,
    ``address``, ``dashboard`` when one is served); ``tasks`` (live records by
    state: waiting, queued, processing, memory, erred, released); ``clients`` (the
    users' clients: not the client ``asking`` for this status, nor services such as
    the job queue);
    ``threads``; ``pools`` (cluster-wide: ``name``, ``total``, ``used``,
    ``bytes``); ``workers`` (by name: ``id``, ``name``, ``address``, ``host``,
    ``nthreads``, ``running``, ``status`` running/paused/closing, ``memory``,
    ``memory_limit``, ``cpu`` (% of a core), ``spilled``, ``stored`` (bytes of
    results held), ``results``, ``received``, ``sent``, ``last_seen``, ``pools``
    (``name``, ``total``, ``used``, ``bytes``, ``units``: None or a list of
    ``label``/``used``/``holders``, ``holders``: keys holding an amount pool),
    ``tasks`` (running: ``key``, ``group``, ``holding``)); ``groups`` (``name``,
    the live states' counts, ``done`` executions, ``failed`` and ``cancelled``
    tasks); ``pending``
    (per kind of request, oldest first: ``request`` text, ``options``,
    ``workers`` (a restriction) or None, ``count``, ``oldest`` key, ``why``,
    ``unsatisfiable``); ``shares`` (every share holding or waiting for something
    and every admitted person, ``share_status.share_rows``: ``share``, ``name``, ``kind``
    person/client/service/other, ``weight``, ``held``, ``dominant`` (``resource``,
    ``fraction``), ``fair``, ``quota``, ``waiting`` (``count``, ``requests``:
    ``request`` text and ``count``), ``quota_holds`` (None, or ``count`` and
    ``resources``: the caps holding them)); ``stream`` (``seq``: the last number given, ``items``:
    ``[seq, worker address, thread, key, group, start, stop, ok, resources]``);
    ``events`` (``seq``, ``items``: ``[seq, time, level, text]``); ``transfers``
    (``received``, ``sent``: bytes between workers since the scheduler started).
    """
    telemetry = state.telemetry
    workers = sorted(state.workers.values(), key=lambda w: (w.name, w.address))
    tasks = dict.fromkeys(LIVE_STATES, 0)
    for tally in telemetry.groups.values():
        for name, count in tally.states.items():
            tasks[name] += count
    return {
        "version": STATUS_VERSION,
        "now": state.now,
        "scheduler": dict(state.identity),
        "tasks": tasks,
        "clients": sum(1 for c in state.clients.values() if not c.durable and c.id != asking),
        "threads": sum(w.nthreads for w in workers),
        "pools": _cluster_pools(workers),
        "workers": [_worker(state, w) for w in workers],
        "groups": _groups(telemetry.groups, telemetry.finished_groups),
        "pending": _pending(state),
        "shares": share_rows(state),
        "stream": {
            "seq": telemetry.stream_seq,
            "items": [
                [
                    e.seq,
                    e.worker,
                    e.thread,
                    e.key,
                    e.group,
                    e.start,
                    e.stop,
                    e.ok,
                    {name: ticks / SCALE for name, ticks in e.resources.items()},
                ]
                for e in telemetry.stream_since(stream_since, stream_limit)
            ],
        },
        "events": {
            "seq": telemetry.events_seq,
            "items": [list(e) for e in telemetry.events_since(events_since)],
        },
        "transfers": {
            "received": telemetry.received_by_departed + sum(w.received for w in workers),
            "sent": telemetry.sent_by_departed + sum(w.sent for w in workers),
        },
    }


def _cluster_pools(workers: list[WorkerRecord]) -> list[dict[str, Any]]:
    """Each pool over the whole cluster: its total and what is in use."""
    total: dict[str, int] = defaultdict(int)
    free: dict[str, int] = defaultdict(int)
    for worker in workers:
        for name, ticks in worker.ledger.total.items():
            total[name] += ticks
            free[name] += worker.ledger.free[name]
    return [
        {
            "name": name,
            "total": total[name] / SCALE,
            "used": (total[name] - free[name]) / SCALE,
            "bytes": is_byte_pool(name),
        }
        for name in sorted(total)
    ]


def _worker(state: SchedulerState, worker: WorkerRecord) -> dict[str, Any]:
    holders = _holders(state, worker)
    running = sorted(worker.processing, key=lambda k: state.tasks[k].seq)
    return {
        "id": worker.id,
        "name": worker.name,
        "address": worker.address,
        "host": worker.address.rpartition(":")[0].rpartition("/")[2],
        "nthreads": worker.nthreads,
        "running": worker.running(),
        "status": _worker_status(worker),
        "memory": worker.memory,
        "memory_limit": worker.memory_limit,
        "cpu": worker.cpu,
        "spilled": worker.spilled,
        "stored": worker.nbytes,
        "results": len(worker.has_what),
        "received": worker.received,
        "sent": worker.sent,
        "last_seen": worker.last_seen,
        "pools": [_pool(worker, name, holders) for name in sorted(worker.ledger.total)],
        "tasks": [_running(state.tasks[key]) for key in running[:MAX_RUNNING]],
    }


def _worker_status(worker: WorkerRecord) -> str:
    if worker.leaving is not None or worker.draining:
        return "closing"
    return "paused" if worker.paused else "running"


def _holders(
    state: SchedulerState, worker: WorkerRecord
) -> dict[tuple[str, str | None], list[str]]:
    """Who holds what here: (pool, unit label) -> keys; (pool, None) for amount pools."""
    out: dict[tuple[str, str | None], list[str]] = defaultdict(list)
    for key in [*worker.processing, *worker.actors]:
        task = state.tasks.get(key)
        allocation = task.allocation if task is not None else None
        if allocation is None or not allocation.resources:
            continue
        for name in allocation.resources:
            labels = allocation.units.get(name)
            if labels:
                for label in labels:
                    out[(name, label)].append(key)
            else:
                out[(name, None)].append(key)
    return out


def _pool(
    worker: WorkerRecord, name: str, holders: dict[tuple[str, str | None], list[str]]
) -> dict[str, Any]:
    ledger = worker.ledger
    total, free = ledger.total[name], ledger.free[name]
    units = ledger.units.get(name)
    return {
        "name": name,
        "total": total / SCALE,
        "used": (total - free) / SCALE,
        "bytes": is_byte_pool(name),
        "units": None
        if units is None
        else [
            {
                "label": label,
                "used": (SCALE - left) / SCALE,
                "holders": holders.get((name, label), []),
            }
            for label, left in units.items()
        ],
        "holders": holders.get((name, None), []),
    }


def _running(task: TaskRecord) -> dict[str, Any]:
    allocation = task.allocation
    held = describe_resources(allocation.resources, allocation.units) if allocation else ""
    group = task.group.name if task.group is not None else ""
    return {"key": task.key, "group": group, "holding": held}


def _groups(live: dict[str, GroupTally], finished: dict[str, GroupTally]) -> list[dict[str, Any]]:
    ordered = sorted(live.items(), key=lambda item: -item[1].live)
    ordered += list(reversed(finished.items()))  # the most recently finished first
    return [
        {
            "name": name,
            **tally.states,
            "done": tally.done,
            "failed": tally.failed,
            "cancelled": tally.cancelled,
        }
        for name, tally in ordered[:MAX_GROUPS]
    ]


def _pending(state: SchedulerState) -> list[dict[str, Any]]:
    """Each kind of request with tasks QUEUED: how many, the oldest, and why it waits."""
    kinds = []
    for key, count in state.telemetry.queued_kinds.items():
        oldest = _oldest(state, key)
        if oldest is not None:
            kinds.append((oldest.order(), key, count, oldest))
    kinds.sort(key=lambda kind: kind[0])
    out = []
    for _, key, count, oldest in kinds[:MAX_KINDS]:
        alternatives = demand_of(key).alternatives
        options = [from_ticks(amounts) for amounts in alternatives]
        restriction = restriction_of(key)
        out.append(
            {
                "request": " or ".join(
                    describe_resources(amounts) or "a thread" for amounts in alternatives
                ),
                "options": options,
                "workers": sorted(restriction.workers) if restriction is not None else None,
                "count": count,
                "oldest": oldest.key,
                "why": why_queued(state, oldest),
                "unsatisfiable": bool(state.workers) and not satisfiable(state, key),
            }
        )
    return out


def _oldest(state: SchedulerState, kind: QueueKey) -> TaskRecord | None:
    """The first task of a kind to start: the head of its heap, unless that is stale.

    A stale head (the task left QUEUED since) is rare, as placement pops those it
    meets; then the heap is searched. A QUEUED task in no heap (held while its
    worker's death is explained) is found in neither: None.
    """
    heap = state.ready.get(kind, ())
    tasks = state.tasks
    if heap:
        task = tasks.get(heap[0][2])
        if task is not None and task.state == QUEUED and task.queue == kind:
            return task
    best: TaskRecord | None = None
    for _, _, key in heap:
        task = tasks.get(key)
        if (
            task is not None
            and task.state == QUEUED
            and (best is None or task.order() < best.order())
        ):
            best = task
    return best


def durations(state: SchedulerState) -> dict[str, Any]:
    """Task durations (seconds) as Prometheus histograms: plain data for ``/metrics``.

    Keys: ``bounds`` (the buckets' upper bounds; +Inf follows); ``all`` (every
    execution) and ``groups`` (by group, up to ``HISTOGRAM_GROUPS`` and then
    ``other``, so they add up to ``all``), each ``buckets`` (cumulative counts, one
    per bound then +Inf), ``sum`` and ``count``.
    """
    telemetry = state.telemetry
    return {
        "bounds": list(DURATION_BUCKETS),
        "all": _histogram(telemetry.all_durations()),
        "groups": {name: _histogram(h) for name, h in telemetry.group_durations.items()},
    }


def _histogram(histogram: Histogram) -> dict[str, Any]:
    return {"buckets": histogram.cumulative(), "sum": histogram.sum, "count": histogram.count}
