"""The task stream as Dask's records: ``Client.get_task_stream`` and the pieces
``get_task_stream()`` and ``performance_report`` share.

The scheduler numbers every finished execution and keeps the last ``STREAM_SIZE``
(50,000) of them (``scheduler/telemetry.py``); a status reply lists those after a
number the caller saw (``scheduler/status.py``). Their times are the scheduler's
monotonic clock, so they are turned into wall-clock (epoch) seconds here with one
offset per reply: the client's ``time.time()`` when the reply arrived less the
status's ``now``. That is exact up to how long the reply took to arrive (the
round trip's second half and the reply's decoding): within milliseconds on one
machine or a LAN, a little more under load. Every time in one reply moves by the
same offset, so durations and order are exact.

A record is shaped like Dask's: ``key``, ``worker`` (address), ``thread``,
``status`` (``"OK"`` or ``"error"``), ``startstops`` (one ``compute`` span),
plus ``group`` and ``resources`` (what the execution held) that Dask lacks.
"""

from __future__ import annotations

import os
import time
import warnings
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from apportion.client import report_page
from apportion.client.link import SchedulerLink
from apportion.core.durations import seconds
from apportion.protocol.cluster import StatusReply, StatusRequest

#: Executions the scheduler keeps, and so the most one reply can carry.
STREAM_SIZE = 50_000

#: An execution as a status lists it:
#: ``[seq, worker, thread, key, group, start, stop, ok, resources]``.
Item = Sequence[Any]


def dask_record(item: Item, offset: float) -> dict[str, Any]:
    """One execution as Dask's task stream record, its times moved by ``offset``."""
    _, worker, thread, key, group, start, stop, ok, resources = item
    return {
        "key": key,
        "worker": worker,
        "thread": thread,
        "status": "OK" if ok else "error",
        "startstops": [{"action": "compute", "start": start + offset, "stop": stop + offset}],
        "group": group,
        "resources": dict(resources),
    }


def dropped(since: int, seq: int, items: Sequence[Item]) -> int:
    """How many executions numbered after ``since`` (up to ``seq``) a reply lacks: the
    scheduler no longer kept them (or the reply's limit cut them)."""
    return max(0, seq - since - len(items))


def warn_dropped(count: int, stacklevel: int = 2) -> None:
    """Say that ``count`` executions are missing, if any are."""
    if count:
        warnings.warn(
            f"{count} executions of the task stream are missing: the scheduler keeps the "
            f"last {STREAM_SIZE:,} and more finished since they were asked for",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )


def epoch(when: float | str | None, now: float) -> float | None:
    """A bound of ``get_task_stream`` in epoch seconds: a number is one already, text is
    a duration before ``now`` (``"10s"``, ``"500 ms"``), as Dask reads them."""
    if when is None or isinstance(when, int | float):
        return when
    ago = seconds(when, "task stream bound")
    assert ago is not None
    return now - ago


def select(
    records: list[dict[str, Any]],
    start: float | None = None,
    stop: float | None = None,
    count: int | None = None,
) -> list[dict[str, Any]]:
    """The records Dask's ``get_task_stream(start, stop, count)`` gives: those that
    finished at or after ``start`` and before ``stop``; ``count`` takes the last
    ``count`` of them, or the first ``count`` from ``start`` when only it is given.

    ``records`` are in the order they finished, as the scheduler numbers them.
    """
    stops = [record["startstops"][-1]["stop"] for record in records]
    first = None if start is None else bisect_left(stops, start)
    last = None if stop is None else bisect_left(stops, stop)
    if count is not None:
        if first is None:
            last = len(records) if last is None else last
            first = last - count
        elif last is None:
            last = first + count
    first = max(0, first or 0)
    last = len(records) if last is None else min(last, len(records))
    return records[first:last]


def get_task_stream(
    link: SchedulerLink,
    start: float | str | None = None,
    stop: float | str | None = None,
    count: int | None = None,
    plot: bool | str = False,
    filename: str | os.PathLike[str] = "task-stream.html",
    bokeh_resources: Any = None,
) -> Any:
    """The executions the scheduler still keeps (the last 50,000) as Dask's records,
    oldest first: those that finished at or after ``start`` and before ``stop``
    (epoch seconds, or text: a duration before now, ``"60s"``), at most ``count``.

    Times are the scheduler's moved to this machine's clock, exact up to the
    reply's transit (module docstring). Dask's ``plot=True`` returns a Bokeh
    figure; there is no Bokeh here, so it raises. ``plot="save"`` writes the
    stream as a self-contained HTML page to ``filename`` and returns ``(records,
    path)``; ``bokeh_resources`` must then be None.
    """
    if plot and plot != "save":
        raise NotImplementedError(
            "get_task_stream(plot=True) returns a Bokeh figure in Dask; apportion has "
            "no Bokeh: use plot='save' (an HTML file) or performance_report()"
        )
    if bokeh_resources is not None:
        raise ValueError("bokeh_resources: apportion's pages embed everything they use")
    limit = count if start is None and stop is None and count is not None else STREAM_SIZE
    path = Path(filename)

    def then(reply: StatusReply) -> Any:
        received = time.time()
        status = reply.status
        items = status["stream"]["items"]
        records = select(
            [dask_record(item, received - status["now"]) for item in items],
            epoch(start, received),
            epoch(stop, received),
            count,
        )
        if not plot:
            return records
        offset = received - status["now"]
        began = min((r["startstops"][0]["start"] for r in records), default=received)
        data = report_page.report_data(
            records, (began, received), offset, status, title="Task stream"
        )
        path.write_text(report_page.render(data), encoding="utf-8")
        return records, path

    return link.ask(lambda rid: StatusRequest(rid, 0, 0, max(0, limit)), then)
