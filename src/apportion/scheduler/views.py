"""Plain-data pictures of the scheduler: ``snapshot`` for views, ``dump`` for bug reports.

Read-only over the core's records; the dashboard and ``scheduler_info`` read these,
never the live records.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from apportion.core.payload import Pickled
from apportion.core.resources import from_ticks
from apportion.scheduler.records import WorkerRecord
from apportion.scheduler.state import SchedulerState


def dump(state: SchedulerState, log_rows: int = 10_000) -> dict[str, Any]:
    """Everything the scheduler knows, as plain data: attach it to a bug report."""
    tasks = {
        key: {
            "state": t.state,
            "worker": t.worker,
            "copies": sorted(t.replicas or ()),
            "deps": list(t.deps),
            "dependents": sorted(t.dependents or ()),
            "resources": from_ticks(t.resources),
            "alternatives": [from_ticks(v) for v in t.demand.wire()[1]],
            "workers": sorted(t.restriction.workers) if t.restriction else None,
            "units": (t.allocation.units or None) if t.allocation else None,
            "priority": t.priority,
            "retries_left": t.retries,
            "wanted_by": sorted(t.wanted_by or ()),
            "reserved_on": t.reserved_on,
            "error": None if t.error is None else [t.error[0], _text(t.error[1])],
        }
        for key, t in state.tasks.items()
    }
    return {
        **snapshot(state),
        # Where Dask's dumps have them: the scheduler's identity, and its versions.
        "scheduler": dict(state.identity),
        "versions": {"scheduler": state.remote.versions},
        "config": dataclasses.asdict(state.config),
        "now": state.now,
        "task_states": tasks,
        "clients": {c.id: sorted(c.wanted) for c in state.clients.values()},
        "deaths": dict(state.deaths),
        "log": [list(row) for row in list(state.log)[-log_rows:]],
    }


def snapshot(state: SchedulerState) -> dict[str, Any]:
    """A plain-data picture of the cluster, shaped like Dask's ``scheduler_info``."""
    counts: dict[str, int] = defaultdict(int)
    for task in state.tasks.values():
        counts[task.state] += 1
    workers = {
        w.address: {
            "id": w.id,
            "name": w.name,
            "nthreads": w.nthreads,
            "resources": from_ticks(w.ledger.total),
            "free_resources": from_ticks(w.ledger.free),
            "units": w.ledger.unit_view(),
            "processing": len(state.assigned(w)),
            "keys": len(w.has_what),
            "nbytes": w.nbytes,
            "pid": w.pid,
            "memory_limit": w.memory_limit,
            "memory": w.memory,
            "spilled_bytes": w.spilled,
            "status": _status(w),
            "reserved_for": w.reserved_by,
        }
        for w in state.workers.values()
    }
    return {
        "type": "Scheduler",
        **state.identity,
        "workers": workers,
        "tasks": dict(counts),
        "clients": len(state.clients),
    }


@dataclasses.dataclass(frozen=True)
class WorkerSnapshot:
    """One worker as the scheduler knew it when asked, with the attributes of Dask's
    ``WorkerState`` that scripts read (``pid``, to pick a worker process to kill in a
    resilience test): a copy, which changing cannot change the scheduler."""

    address: str
    name: str
    pid: int
    nthreads: int
    #: Bytes (0: none).
    memory_limit: int
    #: Each pool's total on this worker.
    resources: Mapping[str, float]
    #: "running", "paused" or "closing".
    status: str


def worker_snapshots(state: SchedulerState) -> Mapping[str, WorkerSnapshot]:
    """The workers connected now, by address, read-only (``Scheduler.workers``)."""
    return MappingProxyType(
        {
            w.address: WorkerSnapshot(
                address=w.address,
                name=w.name,
                pid=w.pid,
                nthreads=w.nthreads,
                memory_limit=w.memory_limit,
                resources=MappingProxyType(from_ticks(w.ledger.total)),
                status=_status(w),
            )
            for w in state.workers.values()
        }
    )


def _status(worker: WorkerRecord) -> str:
    return "closing" if worker.leaving is not None else "paused" if worker.paused else "running"


def _text(detail: Pickled | str) -> str:
    return detail if isinstance(detail, str) else "(a pickled exception; see the client)"
