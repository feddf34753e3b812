"""``progress``: live bars for futures and persisted collections, as Dask draws them.

In a terminal it draws one bar, redrawn in place, in Dask's words
(``[####    ] | 40% Completed | 1.2s``), or with ``multi=True`` one bar per task group
(the key's name without its hash or index: ``inc``, ``sum-aggregate``), and returns
once every future is done; a stream that is not a terminal gets the final drawing
once, not a redraw per tick. In Jupyter (with ipywidgets installed) it returns a
widget at once, a bar per group unless ``multi=False``, that keeps itself current
from a background thread, as Dask's does.

Counts come from done-callbacks, not from polling every future, so a bar over
100,000 futures costs one callback per future and a redraw per tick.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from apportion.client.progress_tally import Tally
from apportion.client.waiting import futures_of
from apportion.core.durations import Duration, seconds
from apportion.core.groups import group_of

#: Seconds between redraws.
DEFAULT_INTERVAL = 0.1


def render(rows: list[tuple[str, int, int, int]], elapsed: float, width: int = 40) -> list[str]:
    """The text bars: ``[####      ] | 40% Completed | inc 4/10 | 1.2s``."""
    name_width = max((len(g) for g, *_ in rows), default=0)
    lines = []
    for group, done, failed, total in rows:
        settled = done + failed
        fraction = settled / total if total else 1.0
        filled = round(fraction * width)
        state = "Completed" if settled == total else "Running"
        if failed:
            state += f", {failed} failed"
        lines.append(
            f"[{'#' * filled}{' ' * (width - filled)}] | {fraction:4.0%} {state} | "
            f"{group:<{name_width}} {settled}/{total} | {elapsed:5.1f}s"
        )
    return lines


def render_one(rows: list[tuple[str, int, int, int]], elapsed: float, width: int = 40) -> str:
    """Dask's single text bar, over every group: ``[####    ] | 40% Completed | 1.2s``
    (and how many failed, when some did)."""
    done = sum(row[1] for row in rows)
    failed = sum(row[2] for row in rows)
    total = sum(row[3] for row in rows)
    fraction = (done + failed) / total if total else 1.0
    failures = f", {failed} failed" if failed else ""
    return (
        f"[{'#' * int(width * fraction):<{width}}] | {int(100 * fraction)}% Completed"
        f"{failures} | {elapsed:.1f}s"
    )


def _in_notebook() -> bool:
    """Running inside a Jupyter kernel, with ipywidgets available to draw in."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ipython = getattr(shell, "get_ipython", lambda: None)()
    if ipython is None or "IPKernelApp" not in getattr(ipython, "config", {}):
        return False
    return importlib.util.find_spec("ipywidgets") is not None


def progress(
    *futures: Any,
    notebook: bool | None = None,
    multi: bool | None = None,
    complete: bool = True,
    interval: Duration = DEFAULT_INTERVAL,
    file: IO[str] | None = None,
    width: int = 40,
    group_by: str | Callable[[str], str] = "prefix",
    **kwargs: Any,
) -> Any:
    """Show progress of futures or persisted collections until they are all done.

    In a terminal it draws one bar for everything, as Dask's does, or with
    ``multi=True`` a bar per task group; in a notebook a bar per task group, or with
    ``multi=False`` one. ``interval`` (seconds or Dask's text, ``"20ms"``) is the
    time between redraws. In a terminal it blocks until done and returns None; in
    Jupyter (``notebook=None`` guesses, ``notebook=False`` forces text) it returns
    a widget at once. ``complete`` is accepted for Dask's signature: finished
    futures are always counted. ``group_by``: "prefix" (the task group, the
    default), or a function of the key giving its bar's name; Dask's "spans" groups
    by task group here, as apportion has no spans. A collection that was not
    persisted has no futures to follow: persist it first (``x = client.persist(x)``).
    """
    if group_by not in ("prefix", "spans") and not callable(group_by):
        raise ValueError(f"`group_by` should be 'spans', 'prefix', or a Callable, not {group_by!r}")
    group = group_by if callable(group_by) else group_of
    every = seconds(interval, "interval")
    if every is None or every <= 0:
        raise ValueError(f"interval must be a positive duration, not {interval!r}")
    tracked = futures_of(list(futures))
    if notebook is None:
        notebook = _in_notebook()
    if notebook:
        from apportion.client.progress_widget import ProgressWidget

        return ProgressWidget(Tally(tracked, multi is not False, group), every)
    out = file if file is not None else sys.stdout
    tally = Tally(tracked, bool(multi), group)
    if multi:
        _draw_text(tally, out, every, width)
    else:
        _draw_one(tally, out, every, width)
    return None


def _draw_one(tally: Tally, out: IO[str], interval: float, width: int) -> None:
    """Dask's text bar: redrawn in place after a carriage return; the last drawing
    ends with one more and a newline, so it stays on screen and in a log."""
    live = bool(getattr(out, "isatty", lambda: False)())
    while True:
        finished = tally.wait(interval)
        if live or finished:
            out.write("\r" + render_one(tally.rows(), time.monotonic() - tally.start, width))
            out.write("\r\n" if finished else "")
            out.flush()
        if finished:
            return


def _draw_text(tally: Tally, out: IO[str], interval: float, width: int) -> None:
    live = bool(getattr(out, "isatty", lambda: False)())
    drawn = 0
    while True:
        finished = tally.wait(interval)
        if live or finished:
            lines = render(tally.rows(), time.monotonic() - tally.start, width)
            if drawn:
                out.write(f"\x1b[{drawn}F")  # back to the first line of the last drawing
            out.write("".join(f"\x1b[2K{line}\n" if live else f"{line}\n" for line in lines))
            out.flush()
            drawn = len(lines)
        if finished:
            return
