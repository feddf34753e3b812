"""The performance report's page: its figures from the task stream and two statuses,
and the one self-contained HTML file that draws them.

The figures are computed here, in Python, so that the page only draws: the rows of
the task stream (one per worker thread), the units of each pool in use over the
window, the bytes each worker received and sent, and a table per task group. The
page is ``performance_report.html`` (package data) with the figures embedded as
JSON in a ``<script type="application/json">``; its script builds every element
with ``textContent``, so keys and warnings (user data) are never read as HTML, and
every ``<`` in the JSON is written ``\\u003c`` so that no ``</script>`` inside a key
ends the block early. It loads nothing: it opens from ``file://`` without a network.

Times in the figures are seconds from the window's start (``started``, epoch
seconds). Resource use is derived from finished executions only: a task still
running when the window closed is not in the task stream, so not in the chart.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

#: Shape of the embedded figures; bumped when a field changes meaning or goes.
REPORT_VERSION = 1
#: The page, in this package; the figures replace ``DATA_MARK`` in it.
TEMPLATE = "performance_report.html"
DATA_MARK = "/*report-data*/"

Record = Mapping[str, Any]
Status = Mapping[str, Any]


def report_data(
    records: Sequence[Record],
    window: tuple[float, float],
    offset: float,
    after: Status,
    before: Status | None = None,
    *,
    dropped: int = 0,
    code: Mapping[str, Any] | None = None,
    title: str = "Performance report",
) -> dict[str, Any]:
    """The figures of the page.

    ``records``: the executions that finished in ``window`` (epoch seconds), as
    ``task_stream.dask_record`` makes them. ``after``: the status at the window's
    end; ``before`` the one at its start, whose cumulative byte counters make the
    transfers (None: no transfers shown). ``offset`` turns the statuses' scheduler
    times (warnings) into epoch seconds. ``dropped``: executions the scheduler no
    longer kept. ``code``: where the report was opened (``filename``, ``lineno``,
    ``function``, ``source``).
    """
    origin, end = window
    names = {w["address"]: w["name"] for s in (before, after) if s for w in s["workers"]}
    rows, lanes = _lanes(records, names)
    return {
        "version": REPORT_VERSION,
        "title": title,
        "scheduler": after["scheduler"].get("address", ""),
        "started": origin,
        "duration": _rel(max(end, origin), origin),
        "summary": {
            "tasks": len(records),
            "failures": sum(r["status"] != "OK" for r in records),
            "workers": len(after["workers"]),
            "threads": after["threads"],
            "dropped": dropped,
        },
        "code": dict(code) if code else None,
        "rows": rows,
        "executions": [
            [
                r["key"],
                r["group"],
                lane,
                _rel(r["startstops"][0]["start"], origin),
                _rel(r["startstops"][-1]["stop"], origin),
                r["status"] == "OK",
                r["resources"],
            ]
            for r, lane in zip(records, lanes, strict=True)
        ],
        "groups": group_table(records),
        "pools": pool_use(records, window, _pool_totals(after, before)),
        "transfers": None if before is None else transfers(before, after),
        "events": [
            [_rel(when + offset, origin), level, text]
            for _, when, level, text in after["events"]["items"]
            if origin <= when + offset <= end
        ],
    }


def render(data: Mapping[str, Any]) -> str:
    """The page with ``data`` embedded: one HTML file needing nothing else."""
    page = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    embedded = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    before, mark, after = page.partition(DATA_MARK)
    assert mark, f"{TEMPLATE} lacks {DATA_MARK}"
    return before + embedded + after


def _rel(when: float, origin: float) -> float:
    """Seconds after ``origin``, to the microsecond: the page needs no more."""
    return round(when - origin, 6)


def _lanes(
    records: Sequence[Record], names: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[int]]:
    """The task stream's rows, one per worker thread, and each record's row.

    An execution goes on its thread's row unless that row is busy then (threads not
    reported, or a seceded task's), in which case on the worker's first free one, so
    that no two bars of a row overlap.
    """
    ends: dict[str, list[float]] = defaultdict(list)  # per worker: each lane's last stop
    placed: dict[int, tuple[str, int]] = {}
    order = sorted(range(len(records)), key=lambda i: records[i]["startstops"][0]["start"])
    for i in order:
        record = records[i]
        start, stop = record["startstops"][0]["start"], record["startstops"][-1]["stop"]
        lanes = ends[record["worker"]]
        wanted = record.get("thread") or 0
        while len(lanes) <= wanted:
            lanes.append(float("-inf"))
        lane = wanted if lanes[wanted] <= start else _free_lane(lanes, start)
        lanes[lane] = stop
        placed[i] = (record["worker"], lane)
    rows = sorted({(names.get(worker, worker), worker, lane) for worker, lane in placed.values()})
    index = {(worker, lane): n for n, (_, worker, lane) in enumerate(rows)}
    return (
        [{"worker": worker, "name": name, "thread": lane} for name, worker, lane in rows],
        [index[placed[i]] for i in range(len(records))],
    )


def _free_lane(lanes: list[float], start: float) -> int:
    for lane, last in enumerate(lanes):
        if last <= start:
            return lane
    lanes.append(float("-inf"))
    return len(lanes) - 1


def group_table(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Per task group: executions, their total, mean and longest time, and failures;
    the group with the most time first."""
    spans: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    for r in records:
        spans[r["group"]].append(r["startstops"][-1]["stop"] - r["startstops"][0]["start"])
        failed[r["group"]] += r["status"] != "OK"
    table = [
        {
            "name": group,
            "count": len(times),
            "total": sum(times),
            "mean": sum(times) / len(times),
            "max": max(times),
            "failed": failed[group],
        }
        for group, times in spans.items()
    ]
    return sorted(table, key=lambda row: (-row["total"], row["name"]))


def _pool_totals(after: Status, before: Status | None) -> dict[str, dict[str, Any]]:
    totals = {p["name"]: p for p in (before or {}).get("pools", [])}
    totals.update({p["name"]: p for p in after["pools"]})
    return totals


def pool_use(
    records: Sequence[Record], window: tuple[float, float], totals: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per pool, cluster-wide: the amount in use over ``window`` as a step series
    ``[[seconds from its start, amount], ...]``, from what each execution held
    while it ran (the part of it inside the window).

    The amount changes only at the points listed and holds until the next one;
    where a task finishes as another starts, the release comes first.
    """
    origin, end = window
    steps: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        start = min(max(r["startstops"][0]["start"], origin), end) - origin
        stop = min(max(r["startstops"][-1]["stop"], origin), end) - origin
        for name, amount in r["resources"].items():
            steps[name] += [(start, amount), (stop, -amount)]
    out = []
    for name in sorted(set(totals) | set(steps)):
        pool = totals.get(name, {})
        out.append(
            {
                "name": name,
                "total": pool.get("total", 0.0),
                "bytes": pool.get("bytes", False),
                "series": _steps(steps[name], end - origin),
            }
        )
    return out


def _steps(changes: list[tuple[float, float]], duration: float) -> list[list[float]]:
    series = [[0.0, 0.0]]
    level = 0.0
    for when, delta in sorted(changes):
        level = round(level + delta, 9)  # amounts are multiples of 1e-4: no drift kept
        when = round(when, 6)
        if series[-1][0] == when:
            series[-1][1] = level
        else:
            series.append([when, level])
    if series[-1][0] < duration:
        series.append([round(duration, 6), level])
    return series


def transfers(before: Status, after: Status) -> list[dict[str, Any]]:
    """Bytes each worker received from and sent to other workers in the window: the
    difference of its cumulative counters (a worker that joined meanwhile counts
    from zero; one that left is missing: its counters went with it)."""
    was = {w["address"]: w for w in before["workers"]}
    out = []
    for worker in after["workers"]:
        old = was.get(worker["address"])
        out.append(
            {
                "worker": worker["address"],
                "name": worker["name"],
                "received": worker["received"] - (old["received"] if old else 0),
                "sent": worker["sent"] - (old["sent"] if old else 0),
                "joined": old is None,
                "cpu": worker.get("cpu", 0.0),
            }
        )
    return out
