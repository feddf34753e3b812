"""The backlog: the work still waiting after a placement pass, by kind of request;
what a cluster that can grow (``apportion.deploy``) reads to decide which workers to
add, and when one is idle.

Read-only over the core's records, like ``views``. Everything still QUEUED after a
placement pass is work that cannot start now: either no worker has room for it, or
no worker could ever hold it. Each kind of request is counted once, with the
alternatives of its ``Demand``, so a sweep of 10,000 GPU tasks is one line.
"""

from __future__ import annotations

from typing import Any

from apportion.core.demand import Demand
from apportion.scheduler.records import QUEUED, Restricted, demand_of, kind_of, restriction_of
from apportion.scheduler.state import SchedulerState


def backlog(state: SchedulerState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The kinds of waiting work and the workers, as plain data (ticks, not floats).

    Waiting work: ``options`` (the alternatives of its demand, each ``{pool: ticks}``,
    in order of preference; ``[{}]`` for tasks that need only a thread), ``count`` and
    ``restricted`` (tasks bound to named workers, which no new worker can help).
    Workers: ``name``, ``address``, ``running`` (tasks and runs it holds) and
    ``leaving`` (draining). The keys are the wire's (``protocol.cluster``): unchanged.
    """
    counts: dict[Demand | Restricted, int] = {}
    for key, heap in state.ready.items():
        # A heap may hold a key twice (requeued before its old entry was popped).
        count = len(
            {k for _, _, k in heap if (task := state.tasks.get(k)) and task.state == QUEUED}
        )
        if count:
            kind = kind_of(key)  # every share's tasks of a kind: one line
            counts[kind] = counts.get(kind, 0) + count
    queued = []
    for kind, count in counts.items():
        restriction = restriction_of(kind)
        queued.append(
            {
                "options": [dict(amounts) for amounts in demand_of(kind).alternatives],
                "count": count,
                "restricted": restriction is not None and not restriction.loose,
            }
        )
    workers = [
        {
            "name": w.name,
            "address": w.address,
            "running": len(w.processing) + len(w.actors),
            "leaving": w.leaving is not None,
        }
        for w in state.workers.values()
    ]
    return queued, workers
