"""What ``apportion runs`` prints: a table of runs, one run in detail, progress.

Pure functions of records and counts. The current time and the time zone come in as
arguments, so the same records always print the same text and tests can say exactly
what they expect.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime, tzinfo

from apportion.core.resources import describe_spec
from apportion.runs.journal import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FINISHED,
    LOST,
    QUEUED,
    RUNNING,
    STAGED,
    TIMED_OUT,
    RunRecord,
    describe_exit,
)
from apportion.runs.spec import format_time_limit

#: Order states are mentioned in: how runs ended first, then what is still to come.
_ORDER = (COMPLETED, FAILED, CANCELLED, LOST, RUNNING, QUEUED, STAGED)

_HEADER = ("ID", "NAME", "STATE", "RESOURCES", "WORKER", "AGE", "INFO")


def format_duration(seconds: float) -> str:
    """Roughly how long, in its largest whole unit: ``"3s"``, ``"5m"``, ``"2h"``, ``"4d"``."""
    whole = max(0, int(seconds))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def outcome(record: RunRecord) -> str:
    """How a finished run ended, in a word or two: ``"exit 1"``, ``"SIGKILL"``, ``"timed out"``.

    ``""`` for a run that has not finished. Without an exit status the reason is shown,
    cut short (a run cancelled while staged never had a process).
    """
    if record.state not in FINISHED:
        return ""
    if record.reason.startswith(TIMED_OUT):
        return TIMED_OUT
    return describe_exit(record.exit_code, record.signal) or _cut(record.reason, 40)


def format_runs(records: Sequence[RunRecord], now: float) -> str:
    """A table of runs, one per line under a header; ``"no runs"`` if there are none.

    RESOURCES shows what a running run holds (its units, ``gpu=[1]``), else what it
    asked for, with byte pools in binary units (``memory=46.6 GiB``) as everywhere.
    INFO says how a finished run ended, or why a waiting one waits.
    """
    if not records:
        return "no runs"
    rows = [_HEADER, *(_row(record, now) for record in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines = []
    for row in rows:
        cells = [row[0].rjust(widths[0])]
        cells += [cell.ljust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _row(record: RunRecord, now: float) -> tuple[str, ...]:
    held = record.state == RUNNING and record.held
    return (
        str(record.id),
        _name(record),
        record.state,
        describe_spec(record.held if held else record.spec.resources),
        record.worker,
        format_duration(now - record.created),
        _info(record),
    )


def _name(record: RunRecord) -> str:
    """The name column: ``sweep[3]``; an unnamed array element is just ``[3]``."""
    index = "" if record.array_index is None else f"[{record.array_index}]"
    return record.name + index


def _info(record: RunRecord) -> str:
    if record.state in FINISHED:
        return outcome(record)
    if record.cancel_requested:
        return "cancel requested"
    if record.state == RUNNING:
        if record.attempts <= 1:
            return ""
        preempted = f" ({record.preemptions} preempted)" if record.preemptions else ""
        return f"attempt {record.attempts}{preempted}"
    if record.preemptions and record.reason.startswith("preempted"):
        # Stopped to let another share in: say so, then what it waits for now.
        return "; ".join(part for part in ("preempted", record.waiting) if part)
    return record.waiting


def format_run(
    record: RunRecord, history: Sequence[tuple[float, str]], *, tz: tzinfo | None = None
) -> str:
    """Everything about one run, then its history (for ``apportion runs show ID``).

    Times are shown in ``tz`` (None: local time).
    """
    spec = record.spec
    fields: list[tuple[str, str]] = [
        ("state", _state_line(record)),
        ("command", shlex.join(spec.command)),
        ("cwd", spec.cwd),
        ("resources", describe_spec(spec.resources) or "none"),
    ]
    if record.held:
        fields.append(("held", describe_spec(record.held)))
    if record.worker:
        fields.append(("worker", record.worker))
    if record.array_index is not None:
        fields.append(("array", f"element {record.array_index} of array {record.array_id}"))
    fields += [
        ("priority", str(record.priority)),
        ("retries", str(spec.retries)),
        ("time limit", "none" if spec.time_limit is None else format_time_limit(spec.time_limit)),
        ("environment", f"{len(spec.env)} variables, as at submission"),
        ("created", _when(record.created, tz)),
    ]
    if record.started is not None:
        fields.append(("started", _when(record.started, tz)))
    if record.ended is not None:
        fields.append(("ended", _when(record.ended, tz)))
    fields.append(("attempts", str(record.attempts)))
    if record.preemptions:
        fields.append(("preempted", f"{record.preemptions} (not failures: no retry used)"))
    if spec.preemptible:
        fields.append(("preemptible", "yes: the scheduler may stop it and run it again"))
    optional = (
        ("exit", describe_exit(record.exit_code, record.signal)),
        ("reason", record.reason),
        ("waiting", record.waiting),
        ("cancel", "requested" if record.cancel_requested else ""),
    )
    fields += [(key, value) for key, value in optional if value]
    width = max(len(key) for key, _ in fields) + 1
    title = f"run {record.id}" + (f"  {record.label()}" if record.name else "")
    lines = [title, *(f"  {key + ':':<{width}} {value}" for key, value in fields), "history:"]
    lines += [f"  {_when(t, tz)}  {text}" for t, text in history] or ["  (none)"]
    return "\n".join(lines)


def _state_line(record: RunRecord) -> str:
    if record.state == RUNNING:
        return f"running on {record.worker}"
    how = outcome(record)
    return f"{record.state} ({how})" if how else record.state


def _when(timestamp: float, tz: tzinfo | None) -> str:
    return datetime.fromtimestamp(timestamp, tz).strftime("%Y-%m-%d %H:%M:%S")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def progress_line(counts: Mapping[str, int], width: int = 30) -> str:
    """A bar of finished runs out of all, then the counts that are not zero.

    ``[#######-----------------------]  7/20 done  (5 completed, 2 failed; 3 running, 10 queued)``
    """
    if width < 1:
        raise ValueError(f"progress bar width must be at least 1, not {width}")
    total = sum(counts.values())
    done = sum(counts.get(state, 0) for state in FINISHED)
    filled = done * width // total if total else 0
    bar = "#" * filled + "-" * (width - filled)
    line = f"[{bar}] {done:>{len(str(total))}}/{total} done"
    ended = _mentions(counts, [s for s in _states(counts) if s in FINISHED])
    to_come = _mentions(counts, [s for s in _states(counts) if s not in FINISHED])
    detail = "; ".join(part for part in (ended, to_come) if part)
    return f"{line}  ({detail})" if detail else line


def summary(counts: Mapping[str, int]) -> str:
    """One closing line: ``"20 runs: 18 completed, 2 failed"``."""
    total = sum(counts.values())
    if not total:
        return "no runs"
    noun = "run" if total == 1 else "runs"
    return f"{total} {noun}: {_mentions(counts, _states(counts))}"


def _states(counts: Mapping[str, int]) -> list[str]:
    """Known states in ``_ORDER``, then any others (none today) so that none is hidden."""
    return [*_ORDER, *sorted(set(counts) - set(_ORDER))]


def _mentions(counts: Mapping[str, int], states: Sequence[str]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in states if counts.get(s))
