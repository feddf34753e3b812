"""The card a notebook shows for a ``Client`` or a ``LocalCluster``: HTML from a snapshot.

Pure: ``render`` turns ``CardFacts`` (what ``scheduler_info()`` returned, the
time, the client's own status) into one HTML string, so every fact on the card is
tested without a socket. Jupyter shows it through ``_repr_html_``; the browser
test loads it as a page.

The markup is well-formed XML (Dask's tests parse its card as XML, and some
notebook front ends do), every value from the cluster is escaped (a worker's name
or a pool's is whatever its owner typed), and there is no script and no external
style: a notebook renders untrusted output without them.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from apportion.core.sizes import format_bytes

#: Workers listed one by one; the rest are counted (a card, not the dashboard).
WORKER_ROWS = 8

_STYLE = "font-family: sans-serif; font-size: 13px; line-height: 1.4"
_CELL = "text-align: left; padding: 1px 10px 1px 0"
_TABLE = "border-collapse: collapse; margin: 4px 0 10px 0"


@dataclass(frozen=True)
class CardFacts:
    """What a card shows, gathered by whoever draws it (client/cluster_control.py,
    deploy/local.py)."""

    #: "Client" or "LocalCluster".
    kind: str
    #: The client's or the cluster's name.
    name: str
    #: Its own status in a few words: "connected", "closed", "not connected yet"...
    status: str
    #: The scheduler's address as known here ("" when none is known yet).
    address: str
    #: ``scheduler_info()``'s picture of the cluster; None: no scheduler connected.
    info: Mapping[str, Any] | None
    #: A link to the dashboard (a fresh one-time login link); None: it serves none.
    dashboard: str | None
    #: Now, wall-clock seconds: how long the scheduler has been up is read from it.
    now: float
    #: A line under the title: where ``info`` came from, when it is not fresh.
    note: str = ""


def render(facts: CardFacts) -> str:
    """The card as one HTML fragment (a ``div``): scheduler, workers, pools, dashboard."""
    title = (
        f"<p><strong>apportion {_e(facts.kind)}</strong> {_e(facts.name)} ({_e(facts.status)})</p>"
    )
    parts = [f'<div class="apportion-card" style="{_STYLE}">', title]
    if facts.note:
        parts.append(f'<p class="note"><em>{_e(facts.note)}</em></p>')
    if facts.info is None:
        parts.append("<p>No scheduler connected.</p>")
        if facts.address:
            parts.append(_table([("Scheduler", _e(facts.address))], "scheduler"))
        parts.append("</div>")
        return "\n".join(parts)
    info = facts.info
    workers = _workers(info)
    parts.append(_scheduler(facts, info))
    parts.append(_totals(workers))
    parts.append(_tasks(info))
    parts.append(_pools(workers))
    parts.append(_worker_rows(workers))
    parts.append("</div>")
    return "\n".join(part for part in parts if part)


def _scheduler(facts: CardFacts, info: Mapping[str, Any]) -> str:
    address = str(info.get("address") or facts.address)
    rows = [("Scheduler", _e(address))]
    started = info.get("started")
    if isinstance(started, int | float):
        rows.append(("Up for", _e(up_for(facts.now - started))))
    if facts.dashboard:
        parts = urlsplit(facts.dashboard)
        shown = f"{parts.scheme}://{parts.netloc}/" if parts.netloc else facts.dashboard
        link = (
            f'<a class="dashboard" href="{_e(facts.dashboard)}" target="_blank" '
            f'rel="noopener">{_e(shown)}</a> (a one-time login link)'
        )
        rows.append(("Dashboard", link))
    elif info.get("dashboard"):  # served, but no link can be made here now
        rows.append(("Dashboard", f"{_e(info['dashboard'])} (no login link: {_e(facts.status)})"))
    else:
        rows.append(("Dashboard", "none: this scheduler serves no dashboard"))
    return _table(rows, "scheduler")


def _totals(workers: list[Mapping[str, Any]]) -> str:
    threads = sum(int(w.get("nthreads") or 0) for w in workers)
    limits = [int(w.get("memory_limit") or 0) for w in workers]
    used = sum(int(w.get("memory") or 0) for w in workers)
    limit = format_bytes(sum(limits), digits=2) if any(limits) else "no limit"
    # Memory in use arrives with the workers' heartbeats: none reported yet says nothing.
    in_use = f" ({_e(format_bytes(used, digits=2))} in use)" if used else ""
    return (
        f'<p class="workers"><strong>Workers:</strong> {len(workers)}'
        f" &#183; <strong>Total threads: </strong>{threads}"
        f" &#183; <strong>Total memory: </strong>{_e(limit)}{in_use}</p>"
    )


def _tasks(info: Mapping[str, Any]) -> str:
    counts = info.get("tasks")
    if not isinstance(counts, Mapping) or not counts:
        return "<p><strong>Tasks:</strong> none</p>"
    text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"<p><strong>Tasks:</strong> {_e(text)}</p>"


def _pools(workers: list[Mapping[str, Any]]) -> str:
    """Each pool's free and total units summed over the cluster: what a resource
    request can get now, which is what apportion places by."""
    total: dict[str, float] = {}
    free: dict[str, float] = {}
    holders: dict[str, int] = {}
    for worker in workers:
        mine = worker.get("resources") or {}
        left = worker.get("free_resources") or {}
        for name, amount in mine.items():
            total[name] = total.get(name, 0.0) + float(amount)
            free[name] = free.get(name, 0.0) + float(left.get(name, 0.0))
            holders[name] = holders.get(name, 0) + 1
    if not total:
        return "<p><strong>Resource pools:</strong> none</p>"
    rows = "".join(
        f'<tr data-pool="{_e(name)}"><td style="{_CELL}">{_e(name)}</td>'
        f'<td style="{_CELL}" class="free">{_e(format_amount(free[name]))}</td>'
        f'<td style="{_CELL}" class="total">{_e(format_amount(total[name]))}</td>'
        f'<td style="{_CELL}">{holders[name]}</td></tr>'
        for name in sorted(total)
    )
    head = "".join(
        f'<th style="{_CELL}">{h}</th>' for h in ("Resource pool", "Free", "Total", "Workers")
    )
    return f'<table class="pools" style="{_TABLE}"><tr>{head}</tr>{rows}</table>'


def _worker_rows(workers: list[Mapping[str, Any]]) -> str:
    if not workers:
        return ""
    head = "".join(
        f'<th style="{_CELL}">{h}</th>'
        for h in ("Worker", "Address", "Threads", "Memory limit", "Pools free / total", "Status")
    )
    rows = []
    for worker in workers[:WORKER_ROWS]:
        limit = int(worker.get("memory_limit") or 0)
        cells = (
            worker.get("name", ""),
            worker.get("address", ""),
            worker.get("nthreads", ""),
            format_bytes(limit, digits=2) if limit else "none",
            _worker_pools(worker),
            worker.get("status", ""),
        )
        rows.append("<tr>" + "".join(f'<td style="{_CELL}">{_e(c)}</td>' for c in cells) + "</tr>")
    more = len(workers) - WORKER_ROWS
    if more > 0:
        rows.append(f'<tr><td colspan="6">and {more} more</td></tr>')
    return f'<table class="worker-list" style="{_TABLE}"><tr>{head}</tr>{"".join(rows)}</table>'


def _worker_pools(worker: Mapping[str, Any]) -> str:
    mine = worker.get("resources") or {}
    left = worker.get("free_resources") or {}
    return ", ".join(
        f"{name} {format_amount(float(left.get(name, 0.0)))}/{format_amount(float(mine[name]))}"
        for name in sorted(mine)
    )


def _workers(info: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The workers of ``info`` with their addresses, by name as people count
    (``worker-2`` before ``worker-10``)."""
    workers = info.get("workers")
    if not isinstance(workers, Mapping):
        return []
    found = [
        {"address": address, **worker}
        for address, worker in workers.items()
        if isinstance(worker, Mapping)
    ]
    return sorted(found, key=lambda w: _natural(str(w.get("name", w["address"]))))


def _natural(text: str) -> list[tuple[int, int | str]]:
    """A sort key that orders the digits in ``text`` as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p]


def format_amount(value: float) -> str:
    """A pool's amount as people write it: ``2``, ``0.5``, ``1e+11``."""
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else f"{value:g}"


def up_for(seconds: float) -> str:
    """``3725`` -> ``"1 h 2 min"``: how long something has run, to the unit that matters."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, hours, days = int(seconds // 60), int(seconds // 3600), int(seconds // 86400)
    if hours < 1:
        return f"{minutes} min"
    if days < 1:
        return f"{hours} h {minutes % 60} min"
    return f"{days} d {hours % 24} h"


def _table(rows: list[tuple[str, str]], kind: str) -> str:
    """A two-column table of headings and cells already escaped."""
    body = "".join(
        f'<tr><th style="{_CELL}">{_e(head)}</th><td style="{_CELL}">{cell}</td></tr>'
        for head, cell in rows
    )
    return f'<table class="{kind}" style="{_TABLE}">{body}</table>'


def _e(value: object) -> str:
    """Escaped for HTML text and attribute values alike (quotes included)."""
    return html.escape(str(value), quote=True)
