"""What ``apportion status`` prints: the cluster's status as lines of text.

Pure: the status dict (``scheduler/status.py``, as ``cluster_status()`` returns it)
and the run counts (``runs_view``) in, lines out. The terminal's width, whether to
colour and whether it can show ``■`` come in as a ``Style``, so the same status
always prints the same lines and tests say exactly what they expect.

Every line is cut to the width *before* it is coloured, so that escape codes never
count as columns and a cut never splits one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.core.resources import SCALE, describe_amount
from apportion.runs.run_states import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FINISHED,
    LOST,
    QUEUED,
    RUNNING,
    STAGED,
    STATES,
)

#: Groups, kinds of waiting request and warnings shown; the rest are counted.
MAX_GROUPS = 10
MAX_PENDING = 10
MAX_WARNINGS = 5
#: An indexed pool with at most this many units gets one bar cell per unit.
MAX_UNIT_CELLS = 16
#: Cells of every other bar.
BAR_CELLS = 10
#: Longest key shown where keys are listed (units, oldest task).
KEY_WIDTH = 24

#: Order run states are named in: how runs ended, then what is still to come.
_RUN_ORDER = (COMPLETED, FAILED, CANCELLED, LOST, RUNNING, QUEUED, STAGED)

#: Live task states, in the order the header names them, with the words it uses.
_TASK_STATES = (
    ("processing", "processing"),
    ("queued", "queued"),
    ("waiting", "waiting"),
    ("memory", "in memory"),
    ("erred", "erred"),
    ("released", "released"),
)

#: How a group's tasks ended besides in memory, with the words used: a cancelled task
#: is the user's choice, never counted as a failure.
_GROUP_ENDS = (("failed", "failed"), ("cancelled", "cancelled"))

_ANSI = {"title": "\x1b[1m", "bad": "\x1b[1;31m", "warn": "\x1b[33m", "dim": "\x1b[2m"}
_RESET = "\x1b[0m"
#: Runs of hex digits in keys (Dask's tokens): only their start tells keys apart.
_HEX = re.compile(r"[0-9a-f]{8,}")
#: A tuple key as text: ``('name-token', 0)``.
_TUPLE_KEY = re.compile(r"\('([^']*)',\s*(.*)\)")


@dataclass(frozen=True, slots=True)
class Style:
    """How the lines are drawn."""

    #: Columns available; every line is cut to fit.
    width: int = 80
    #: ANSI colour and bold (a terminal that wants it; never with NO_COLOR).
    colour: bool = False
    #: ``■□`` and ``…``, else ``#-`` and ``...`` (a terminal that cannot encode them).
    unicode: bool = True


@dataclass(frozen=True, slots=True)
class _Line:
    text: str
    tone: str | None = None


def render(
    status: Mapping[str, Any],
    runs: Mapping[str, Any] | None = None,
    *,
    style: Style = Style(),
    warnings: Sequence[Sequence[Any]] | None = None,
) -> list[str]:
    """The lines of ``apportion status``: header, pools, shares, groups, runs, waiting,
    warnings.

    ``runs`` is ``runs_view``'s dict, or None to say nothing of runs. ``warnings``
    are event items (``[seq, time, level, text]``) to list in place of the
    status's own (a watch keeps the last few across refreshes, each of which
    brings only the new ones).
    """
    events = status["events"]["items"] if warnings is None else warnings
    lines = [
        *_header(status),
        *_pools(status, style),
        *_shares(status.get("shares", [])),
        *_groups(status["groups"], style),
        *([] if runs is None else _runs(runs, style)),
        *_pending(status["pending"]),
        *_warnings(events, status["now"]),
    ]
    return [_draw(line, style) for line in lines]


def fit_height(lines: Sequence[str], rows: int) -> list[str]:
    """``lines`` cut to ``rows`` (a screen redrawn in place must not scroll), the
    last row then saying how many were left out."""
    if len(lines) <= rows:
        return list(lines)
    kept = max(0, rows - 1)
    return [*lines[:kept], f"({len(lines) - kept} more lines: enlarge the terminal)"]


def short_key(key: object, width: int = KEY_WIDTH, *, unicode: bool = True) -> str:
    """A task key short enough to list: tokens cut to 4 digits, tuples as ``name[0]``."""
    text = str(key)
    tuple_key = _TUPLE_KEY.fullmatch(text)
    if tuple_key:
        text = f"{tuple_key[1]}[{tuple_key[2]}]"
    text = _HEX.sub(lambda found: found[0][:4], text)
    return _cut(text, width, unicode)


def bar(used: float, total: float, cells: int, *, unicode: bool = True) -> str:
    """``[■■□□]``: ``used`` of ``total`` in ``cells``; any use shows, and only a full
    pool fills every cell."""
    if total <= 0:
        filled = 0
    else:
        filled = round(cells * min(used, total) / total)
        if used > 0:
            filled = max(filled, 1)
        if used < total:
            filled = min(filled, cells - 1)
    full, empty = ("■", "□") if unicode else ("#", "-")
    return "[" + full * filled + empty * (cells - filled) + "]"


def ago(seconds: float) -> str:
    """``"12 s ago"``, ``"3 min ago"``, ``"2 h ago"``, ``"4 d ago"``."""
    whole = max(0, int(seconds))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if whole >= size:
            return f"{whole // size} {unit} ago"
    return f"{whole} s ago"


# --- sections -------------------------------------------------------------------------


def _header(status: Mapping[str, Any]) -> list[_Line]:
    scheduler = status["scheduler"]
    workers = len(status["workers"])
    parts = [
        _count(workers, "worker"),
        _count(status["threads"], "thread"),
        _count(status["clients"], "client"),
    ]
    title = f"scheduler {scheduler.get('address', '?')}: {', '.join(parts)}"
    tasks = status["tasks"]
    counted = [f"{tasks[name]} {word}" for name, word in _TASK_STATES if tasks.get(name)]
    return [_Line(title, "title"), _Line("tasks: " + (", ".join(counted) or "none"))]


def _pools(status: Mapping[str, Any], style: Style) -> list[_Line]:
    lines: list[_Line] = []
    totals = status["pools"]
    if totals:
        lines += [_Line(""), _Line("pools", "title")]
        name_width = max(len(pool["name"]) for pool in totals)
        lines += [_Line("  " + _pool_line(pool, name_width, style)) for pool in totals]
    if status["workers"]:
        lines += [_Line(""), _Line("workers", "title")]
    for worker in status["workers"]:
        lines.append(_Line("  " + _worker_line(worker), None if _working(worker) else "warn"))
        pools = worker["pools"]
        name_width = max((len(pool["name"]) for pool in pools), default=0)
        for pool in pools:
            line = _pool_line(pool, name_width, style)
            holders = _holders_text(pool, style)
            lines.append(_Line(f"    {line}  {holders}".rstrip()))
    return lines


def _working(worker: Mapping[str, Any]) -> bool:
    return bool(worker["status"] == "running")


def _worker_line(worker: Mapping[str, Any]) -> str:
    parts = [
        f"{worker['running']}/{_count(worker['nthreads'], 'thread')} busy",
        f"cpu {worker['cpu']:.0f}%",
    ]
    memory = describe_amount("memory", round(worker["memory"] * SCALE))
    if worker["memory_limit"]:
        memory += "/" + describe_amount("memory", round(worker["memory_limit"] * SCALE))
    parts.append(f"memory {memory}")
    if worker["spilled"]:
        parts.append("spilled " + describe_amount("memory", round(worker["spilled"] * SCALE)))
    state = "" if _working(worker) else f" ({worker['status']})"
    return f"{worker['name']}{state}  {worker['address']}  {', '.join(parts)}"


def _pool_line(pool: Mapping[str, Any], name_width: int, style: Style) -> str:
    """``gpu [■■□□] 2/4``; a byte pool's amounts as GiB (``4 GiB/16 GiB``)."""
    name, used, total = pool["name"], pool["used"], pool["total"]
    units = pool.get("units")
    cells = len(units) if units and len(units) <= MAX_UNIT_CELLS else BAR_CELLS
    drawn = bar(used, total, cells, unicode=style.unicode)
    return f"{name:<{name_width}} {drawn} {_amount(name, used)}/{_amount(name, total)}"


def _holders_text(pool: Mapping[str, Any], style: Style) -> str:
    """``0:train-3 1:train-4 2:free``, or, for an amount pool, the keys holding it."""
    units = pool.get("units")
    if units is None:
        holders = pool.get("holders") or []
        return "held by " + _keys(holders, style) if holders else ""
    return " ".join(f"{unit['label']}:{_unit_text(unit, style)}" for unit in units)


def _unit_text(unit: Mapping[str, Any], style: Style) -> str:
    used, holders = unit["used"], unit["holders"]
    if not used and not holders:
        return "free"
    who = _keys(holders, style) if holders else "busy"
    return who if used >= 1 else f"{who}({used:g})"


def _keys(keys: Iterable[object], style: Style) -> str:
    return "+".join(short_key(key, unicode=style.unicode) for key in keys)


def _shares(shares: Sequence[Mapping[str, Any]]) -> list[_Line]:
    """Each share's holdings against its fair share and quota, then its waiting work;
    only where there is a division to show (two shares or more, or a person's)."""
    if len(shares) < 2 and not any(row["kind"] == "person" for row in shares):
        return []
    names = [_share_name(row) for row in shares]
    holds = [_amounts(row["held"]) for row in shares]
    dominant = [_dominant(row["dominant"]) for row in shares]
    name_width = max(len("share"), *map(len, names))
    hold_width = max(len("holds"), *map(len, holds))
    dominant_width = max(len("dominant"), *map(len, dominant))
    head = (
        f"  {'share':<{name_width}}  weight  {'holds':<{hold_width}}  "
        f"{'dominant':<{dominant_width}}  fair  quota"
    )
    lines = [_Line(""), _Line("shares", "title"), _Line(head, "dim")]
    for row, name, held, most in zip(shares, names, holds, dominant, strict=True):
        quota = _amounts(row["quota"]) if row["quota"] else "-"
        text = (
            f"  {name:<{name_width}}  {row['weight']:>6g}  {held:<{hold_width}}  "
            f"{most:<{dominant_width}}  {row['fair']:>4.0%}  {quota}"
        )
        lines.append(_Line(text))
    for row, name in zip(shares, names, strict=True):
        waiting = row["waiting"]
        if waiting["count"]:
            lines.append(_Line(f"  {name}: {_waiting_text(waiting, row['quota_holds'])}"))
    return lines


def _share_name(row: Mapping[str, Any]) -> str:
    """A person's share by their name, a client's by the name it gave; a service's and a
    gone one's marked."""
    suffix = {"service": " (service)", "other": " (left)"}.get(row["kind"], "")
    return f"{row.get('name', row['share'])}{suffix}"


def _amounts(amounts: Mapping[str, float]) -> str:
    return " ".join(f"{name}={_amount(name, value)}" for name, value in amounts.items()) or "-"


def _dominant(dominant: Mapping[str, Any]) -> str:
    if dominant["resource"] is None:
        return "-"
    return f"{dominant['resource']} {dominant['fraction']:.0%}"


def _waiting_text(waiting: Mapping[str, Any], holds: Mapping[str, Any] | None) -> str:
    """``3 waiting (GPU=1 x3), held by quota GPU=2``."""
    requests = ", ".join(f"{r['request']} x{r['count']}" for r in waiting["requests"])
    text = f"{waiting['count']} waiting ({requests})"
    if holds:
        caps = _amounts(holds["resources"])
        some = "" if holds["count"] == waiting["count"] else f"{holds['count']} "
        text += f", {some}held by quota {caps}"
    return text


def _groups(groups: Sequence[Mapping[str, Any]], style: Style) -> list[_Line]:
    if not groups:
        return []
    shown = groups[:MAX_GROUPS]
    name_width = max(len(group["name"]) for group in shown)
    lines = [_Line(""), _Line("groups", "title")]
    for group in shown:
        left = group.get("waiting", 0) + group.get("queued", 0) + group.get("processing", 0)
        ended = sum(group.get(name, 0) for name in ("done", "failed", "cancelled"))
        total = ended + left
        drawn = bar(ended, total, BAR_CELLS, unicode=style.unicode)
        counts = [
            f"{group[name]} {word}"
            for name, word in (*_TASK_STATES, *_GROUP_ENDS)
            if group.get(name)
        ]
        text = f"  {group['name']:<{name_width}} {drawn} {ended}/{total} done  {', '.join(counts)}"
        lines.append(_Line(text.rstrip(), "bad" if group.get("erred") else None))
    if len(groups) > len(shown):
        lines.append(_Line(f"  ... and {len(groups) - len(shown)} more groups", "dim"))
    return lines


def _runs(runs: Mapping[str, Any], style: Style) -> list[_Line]:
    lines = [_Line(""), _Line(f"runs ({runs['journal']})", "title")]
    lines.append(_Line("  " + _run_progress(runs["counts"], style)))
    for array in runs["arrays"]:
        label = f"array {array['id']}" + (f" {array['name']}" if array["name"] else "")
        lines.append(_Line(f"  {label}  {_run_progress(array['counts'], style)}"))
    return lines


def _run_progress(counts: Mapping[str, int], style: Style) -> str:
    """``[■■■□] 7/20 done  5 completed, 2 failed, 3 running, 10 queued``."""
    total = sum(counts.values())
    done = sum(counts.get(state, 0) for state in FINISHED)
    order = [*_RUN_ORDER, *(state for state in STATES if state not in _RUN_ORDER)]
    detail = ", ".join(f"{counts[state]} {state}" for state in order if counts.get(state))
    drawn = bar(done, total, BAR_CELLS, unicode=style.unicode)
    return f"{drawn} {done}/{total} done  {detail or 'no runs'}"


def _pending(pending: Sequence[Mapping[str, Any]]) -> list[_Line]:
    """Each kind of waiting request; those no worker can ever meet first, marked."""
    if not pending:
        return []
    ordered = sorted(pending, key=lambda kind: not kind["unsatisfiable"])
    shown = ordered[:MAX_PENDING]
    lines = [_Line(""), _Line(f"waiting ({_count(len(pending), 'kind')} of request)", "title")]
    for kind in shown:
        request = kind["request"]
        if kind.get("workers"):
            request += " on " + ", ".join(kind["workers"])
        verb = "needs" if kind["count"] == 1 else "need"
        text = (
            f"{_count(kind['count'], 'task')} {verb} {request}  oldest {short_key(kind['oldest'])}"
        )
        why = (kind.get("why") or "").splitlines()
        if kind["unsatisfiable"]:
            lines.append(_Line(f"  UNSATISFIABLE: {text}", "bad"))
        else:
            lines.append(_Line(f"  {text}"))
        if why:
            lines.append(_Line(f"    {why[0]}", "bad" if kind["unsatisfiable"] else "dim"))
    if len(ordered) > len(shown):
        lines.append(_Line(f"  ... and {len(ordered) - len(shown)} more kinds", "dim"))
    return lines


def _warnings(events: Sequence[Sequence[Any]], now: float) -> list[_Line]:
    if not events:
        return []
    lines = [_Line(""), _Line("warnings", "title")]
    for _, when, level, text in events[-MAX_WARNINGS:]:
        prefix = "" if level == "warning" else f"{str(level).upper()}: "
        first = str(text).splitlines()[0] if text else ""
        lines.append(_Line(f"  {ago(now - when):>10}  {prefix}{first}", "warn"))
    return lines


# --- text -----------------------------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _amount(name: str, value: float) -> str:
    return describe_amount(name, round(value * SCALE))


def _cut(text: str, width: int, unicode: bool) -> str:
    if len(text) <= width:
        return text
    ellipsis = "…" if unicode else "..."
    if width <= len(ellipsis):
        return text[: max(0, width)]
    return text[: width - len(ellipsis)] + ellipsis


def _draw(line: _Line, style: Style) -> str:
    text = _cut(line.text, style.width, style.unicode)
    if not style.colour or line.tone is None or not text:
        return text
    return _ANSI[line.tone] + text + _RESET
