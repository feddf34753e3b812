"""The cluster's numbers in Prometheus's text format: what ``/metrics`` serves.

Pure: it renders snapshots already taken as plain data (the status from
``apportion.scheduler.status.status``, the duration histograms from
``status.durations``, the event loop's lag, the job queue's counts) and never
reads the scheduler's live records, so a scrape costs what building the status
costs and nothing per queued task.

Names follow Prometheus's conventions: an ``apportion_`` prefix, the unit in the
name, ``_total`` on counters. Label sets are bounded by the status itself (at most
``MAX_GROUPS`` groups, ``HISTOGRAM_GROUPS`` duration histograms plus ``other``, one
series per worker and pool). Resources are exported per worker only: every pool
of every worker is listed, so ``sum by (pool)`` gives the cluster's totals exactly.
Tasks by state are exported per group and, since the groups listed are bounded,
over the whole cluster too (``apportion_cluster_tasks``). Shares are exported by
``share`` (a person's name, or a client's id), as many as the status lists
(``share_status.MAX_SHARES``). docs/metrics.md lists every metric with queries for
Grafana.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: The ``Content-Type`` of the text format rendered here (version 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: (labels, value) of one sample.
Sample = tuple[Mapping[str, str], float]


@dataclass(frozen=True)
class MetricsInput:
    """Everything ``/metrics`` shows, taken by the caller at one moment."""

    #: ``apportion.scheduler.status.status(state)``.
    status: Mapping[str, Any]
    #: ``apportion.scheduler.status.durations(state)``.
    durations: Mapping[str, Any]
    #: apportion's version, a label of ``apportion_scheduler_info``.
    version: str
    #: Seconds the scheduler's event loop woke late, at its last wake-up.
    loop_lag: float = 0.0
    #: The most it woke late over its recent wake-ups (``apportion.loop_lag``).
    loop_lag_max: float = 0.0
    #: The job queue's runs by state (``Journal.counts()``); None: no queue is served,
    #: and ``apportion_runs`` is left out rather than shown as zeros.
    runs: Mapping[str, int] | None = None


def render_metrics(given: MetricsInput) -> str:
    """The metrics in Prometheus's text format, one family after another."""
    out: list[str] = []
    status = given.status
    _scheduler(out, given)
    _tasks(out, status)
    _resources(out, status["workers"])
    _workers(out, status["workers"])
    _shares(out, status.get("shares", []))
    _durations(out, given.durations)
    _transfers(out, status)
    gauge(
        out,
        "apportion_event_loop_lag_seconds",
        "How late the scheduler's event loop woke up at its last periodic wake-up.",
        [({}, given.loop_lag)],
    )
    gauge(
        out,
        "apportion_event_loop_lag_max_seconds",
        "The most the scheduler's event loop woke up late over its recent wake-ups.",
        [({}, given.loop_lag_max)],
    )
    if given.runs is not None:
        gauge(
            out,
            "apportion_runs",
            "Runs in the scheduler's job queue by state.",
            [({"state": state}, n) for state, n in given.runs.items()],
        )
    return "".join(out)


# --- families -------------------------------------------------------------------------


def _scheduler(out: list[str], given: MetricsInput) -> None:
    address = str(given.status["scheduler"].get("address", ""))
    gauge(
        out,
        "apportion_scheduler_info",
        "The scheduler's address and apportion's version; always 1.",
        [({"address": address, "version": given.version}, 1)],
    )
    gauge(out, "apportion_clients", "Clients connected.", [({}, given.status["clients"])])


def _tasks(out: list[str], status: Mapping[str, Any]) -> None:
    states = list(status["tasks"])
    groups = status["groups"]
    gauge(
        out,
        "apportion_cluster_tasks",
        "Live task records by state, over the whole cluster.",
        [({"state": state}, n) for state, n in status["tasks"].items()],
    )
    gauge(
        out,
        "apportion_tasks",
        "Live task records by state and group.",
        [({"state": state, "group": g["name"]}, g[state]) for g in groups for state in states],
    )
    counter(
        out,
        "apportion_tasks_done_total",
        "Executions that finished, by group (a recomputed task counts again).",
        [({"group": g["name"]}, g["done"]) for g in groups],
    )
    counter(
        out,
        "apportion_tasks_failed_total",
        "Tasks that failed (raised, lost, unsatisfiable), by group.",
        [({"group": g["name"]}, g["failed"]) for g in groups],
    )
    counter(
        out,
        "apportion_tasks_cancelled_total",
        "Tasks cancelled, by group (never counted as failed).",
        [({"group": g["name"]}, g["cancelled"]) for g in groups],
    )


def _resources(out: list[str], workers: list[Mapping[str, Any]]) -> None:
    pools = [(w["name"], p) for w in workers for p in w["pools"]]
    gauge(
        out,
        "apportion_resource_total",
        "A worker's supply of a resource pool (bytes for byte pools such as MEMORY).",
        [({"worker": name, "pool": p["name"]}, p["total"]) for name, p in pools],
    )
    gauge(
        out,
        "apportion_resource_used",
        "What running tasks hold of a worker's resource pool (bytes for byte pools).",
        [({"worker": name, "pool": p["name"]}, p["used"]) for name, p in pools],
    )
    gauge(
        out,
        "apportion_resource_units_busy",
        "Units of an indexed pool (gpu=[0,1]) that a task holds any of.",
        [
            ({"worker": name, "pool": p["name"]}, sum(1 for u in p["units"] if u["used"]))
            for name, p in pools
            if p["units"] is not None
        ],
    )


#: Per-worker gauges: (metric, status field, help).
WORKER_GAUGES = (
    ("apportion_worker_threads", "nthreads", "Threads a worker runs tasks on."),
    ("apportion_worker_running_tasks", "running", "Tasks running on a worker."),
    ("apportion_worker_memory_bytes", "memory", "A worker's resident memory, last reported."),
    ("apportion_worker_memory_limit_bytes", "memory_limit", "A worker's memory limit (0: none)."),
    ("apportion_worker_cpu_percent", "cpu", "A worker's CPU use, percent of one core."),
    ("apportion_worker_spilled_bytes", "spilled", "Bytes of results a worker spilled to disk."),
    ("apportion_worker_stored_bytes", "stored", "Bytes of results a worker holds."),
)


def _workers(out: list[str], workers: list[Mapping[str, Any]]) -> None:
    by_status = {"running": 0, "paused": 0, "closing": 0}
    for worker in workers:
        by_status[worker["status"]] = by_status.get(worker["status"], 0) + 1
    gauge(
        out,
        "apportion_workers",
        "Workers connected, by status.",
        [({"status": status}, n) for status, n in by_status.items()],
    )
    for name, field, text in WORKER_GAUGES:
        gauge(out, name, text, [({"worker": w["name"]}, w[field]) for w in workers])
    counter(
        out,
        "apportion_worker_received_bytes_total",
        "Bytes a worker fetched from its peers since it started.",
        [({"worker": w["name"]}, w["received"]) for w in workers],
    )
    counter(
        out,
        "apportion_worker_sent_bytes_total",
        "Bytes a worker served to its peers since it started.",
        [({"worker": w["name"]}, w["sent"]) for w in workers],
    )


def _shares(out: list[str], shares: list[Mapping[str, Any]]) -> None:
    """Each share's figures (``scheduler/share_status.py``), labelled by share."""
    gauge(
        out,
        "apportion_share_info",
        "A share of the cluster, its name and what it stands for (person, client, ...); 1.",
        [({"share": row["share"], "name": row["name"], "kind": row["kind"]}, 1) for row in shares],
    )
    gauge(
        out,
        "apportion_share_held",
        "What a share holds of a resource now (bytes for byte pools; threads: tasks).",
        [
            ({"share": row["share"], "resource": name}, amount)
            for row in shares
            for name, amount in row["held"].items()
        ],
    )
    gauge(
        out,
        "apportion_share_dominant_ratio",
        "The largest fraction of the cluster's supply of any resource a share holds.",
        [({"share": row["share"]}, row["dominant"]["fraction"]) for row in shares],
    )
    gauge(
        out,
        "apportion_share_fair_ratio",
        "A share's fair share: its weight over the active shares' weights (its own counted).",
        [({"share": row["share"]}, row["fair"]) for row in shares],
    )
    gauge(
        out,
        "apportion_share_weight",
        "A share's weight in the fair division.",
        [({"share": row["share"]}, row["weight"]) for row in shares],
    )
    gauge(
        out,
        "apportion_share_quota",
        "A share's hard cap on a resource (bytes for byte pools; threads: tasks).",
        [
            ({"share": row["share"], "resource": name}, amount)
            for row in shares
            for name, amount in (row["quota"] or {}).items()
        ],
    )
    gauge(
        out,
        "apportion_share_waiting_tasks",
        "A share's tasks ready to run and waiting for resources or a thread.",
        [({"share": row["share"]}, row["waiting"]["count"]) for row in shares],
    )
    gauge(
        out,
        "apportion_share_quota_held_tasks",
        "A share's waiting tasks that its quota alone keeps from starting.",
        [({"share": row["share"]}, (row["quota_holds"] or {}).get("count", 0)) for row in shares],
    )


def _durations(out: list[str], durations: Mapping[str, Any]) -> None:
    name = "apportion_task_duration_seconds"
    _family(out, name, "histogram", "How long task executions ran, by group.")
    bounds = [*map(_number, durations["bounds"]), "+Inf"]
    for group, histogram in durations["groups"].items():
        labels = {"group": group}
        for le, count in zip(bounds, histogram["buckets"], strict=True):
            out.append(_sample(f"{name}_bucket", {**labels, "le": le}, count))
        out.append(_sample(f"{name}_sum", labels, histogram["sum"]))
        out.append(_sample(f"{name}_count", labels, histogram["count"]))


def _transfers(out: list[str], status: Mapping[str, Any]) -> None:
    transfers = status["transfers"]
    counter(
        out,
        "apportion_transfer_received_bytes_total",
        "Bytes workers fetched from their peers since the scheduler started.",
        [({}, transfers["received"])],
    )
    counter(
        out,
        "apportion_transfer_sent_bytes_total",
        "Bytes workers served to their peers since the scheduler started.",
        [({}, transfers["sent"])],
    )


# --- the text format ------------------------------------------------------------------


def gauge(out: list[str], name: str, text: str, samples: Iterable[Sample]) -> None:
    """Append a gauge family: its HELP and TYPE lines, then its samples."""
    _family(out, name, "gauge", text)
    out.extend(_sample(name, labels, value) for labels, value in samples)


def counter(out: list[str], name: str, text: str, samples: Iterable[Sample]) -> None:
    """Append a counter family (``name`` ends in ``_total``)."""
    _family(out, name, "counter", text)
    out.extend(_sample(name, labels, value) for labels, value in samples)


def _family(out: list[str], name: str, kind: str, text: str) -> None:
    help_text = text.replace("\\", "\\\\").replace("\n", "\\n")
    out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    if not labels:
        return f"{name} {_number(value)}\n"
    inner = ",".join(f'{key}="{escape_label(str(v))}"' for key, v in labels.items())
    return f"{name}{{{inner}}} {_number(value)}\n"


def escape_label(value: str) -> str:
    """A label value as the text format quotes it: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):  # exact, and bool as 0 or 1
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
