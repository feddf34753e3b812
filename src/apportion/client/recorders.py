"""Recording what the cluster ran during a ``with`` block, as Dask's
``get_task_stream()`` and ``performance_report()`` do.

Both take the task stream's last number on entry and, on exit, ask the scheduler
for the executions numbered after it (``task_stream``), so they see exactly the
tasks that finished inside the block, whoever submitted them. The scheduler keeps
the last 50,000: a block that outlives more than that many executions gets the
last 50,000 and a ``RuntimeWarning`` saying how many are missing.

Either works with ``with`` on a blocking client and with ``async with`` on an
asynchronous one (from its event loop), as in Dask.
"""

from __future__ import annotations

import inspect
import linecache
import os
import sys
import textwrap
import time
import warnings
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from apportion.client import report_page
from apportion.client.client import Client, default_client
from apportion.client.task_stream import STREAM_SIZE, dask_record, dropped, warn_dropped
from apportion.deploy.cluster_options import IgnoredOptionWarning

#: Lines of the ``with`` block shown in a report, at most.
MAX_SOURCE_LINES = 200

Snapshot = tuple[dict[str, Any], float]


def _snapshot(client: Client, since: int = 0, events: int = 0, limit: int = 0) -> Snapshot:
    """The status (and this machine's time at its arrival) through a blocking call."""
    status = client.cluster_status(stream_since=since, events_since=events, stream_limit=limit)
    if inspect.isawaitable(status):
        status.close()  # type: ignore[attr-defined]  # a coroutine, never to be awaited
        raise RuntimeError(
            "this client is asynchronous: use `async with` from its event loop, or a "
            "blocking Client with `with`"
        )
    return status, time.time()


async def _asnapshot(client: Client, since: int = 0, events: int = 0, limit: int = 0) -> Snapshot:
    """``_snapshot`` awaited (a blocking client is simply called)."""
    status = client.cluster_status(stream_since=since, events_since=events, stream_limit=limit)
    if inspect.isawaitable(status):
        status = await status
    return status, time.time()


class _Recorder:
    """Entered: the stream's number then; exited: the executions after it."""

    def __init__(self, client: Client | None) -> None:
        self._client = client
        self._before: Snapshot | None = None

    def _since(self) -> tuple[int, int]:
        assert self._before is not None, "not entered"
        status = self._before[0]
        return status["stream"]["seq"], status["events"]["seq"]

    def _finish(self, before: Snapshot, after: Snapshot) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._opened(2)
        self._before = _snapshot(default_client(self._client))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._before is not None, "not entered"
        since, events = self._since()
        after = _snapshot(default_client(self._client), since, events, STREAM_SIZE)
        self._finish(self._before, after)

    async def __aenter__(self) -> Any:
        self._opened(2)
        self._before = await _asnapshot(default_client(self._client))
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._before is not None, "not entered"
        since, events = self._since()
        after = await _asnapshot(default_client(self._client), since, events, STREAM_SIZE)
        self._finish(self._before, after)

    def _opened(self, depth: int) -> None:
        """Called from ``__enter__`` (or ``__aenter__``): ``depth`` frames up from here
        is the code that entered."""


def _records(before: Snapshot, after: Snapshot) -> tuple[list[dict[str, Any]], float, int]:
    """The executions after ``before``'s number as Dask's records; the clock offset;
    how many the scheduler no longer had."""
    status, received = after
    offset = received - status["now"]
    stream = status["stream"]
    items = stream["items"]
    missing = dropped(before[0]["stream"]["seq"], stream["seq"], items)
    return [dask_record(item, offset) for item in items], offset, missing


class TaskStream(_Recorder):
    """What ``get_task_stream()`` returns: after the block, ``data`` holds the
    executions that finished in it, as ``Client.get_task_stream`` gives them."""

    def __init__(
        self,
        client: Client | None = None,
        plot: bool | str = False,
        filename: str | os.PathLike[str] = "task-stream.html",
    ) -> None:
        if plot and plot != "save":
            raise NotImplementedError(
                "get_task_stream(plot=True) draws a Bokeh figure in Dask; apportion has no "
                "Bokeh: use plot='save' (an HTML file, see filename=) or performance_report()"
            )
        super().__init__(client)
        #: The records, oldest first, once the block is left.
        self.data: list[dict[str, Any]] = []
        #: Dask's Bokeh figure: always None here.
        self.figure: Any = None
        #: The page written on exit with ``plot="save"``; None otherwise.
        self.path: Path | None = Path(filename) if plot else None

    def _finish(self, before: Snapshot, after: Snapshot) -> None:
        self.data, offset, missing = _records(before, after)
        warn_dropped(missing, stacklevel=4)
        if self.path is not None:
            data = report_page.report_data(
                self.data, (before[1], after[1]), offset, after[0], before[0], title="Task stream"
            )
            self.path.write_text(report_page.render(data), encoding="utf-8")


def get_task_stream(
    client: Client | None = None,
    plot: bool | str = False,
    filename: str | os.PathLike[str] = "task-stream.html",
) -> TaskStream:
    """Collect the executions that finish inside a ``with`` (or ``async with``) block::

        with get_task_stream() as ts:
            x.compute()
        ts.data  # [{"key": ..., "worker": ..., "status": "OK", "startstops": [...]}, ...]

    As Dask's, on the default client unless ``client`` is given. ``plot=True`` (a
    Bokeh figure in Dask) raises; ``plot="save"`` writes an HTML page to ``filename``.
    """
    return TaskStream(client, plot, filename)


class performance_report(_Recorder):  # lower case: Dask's name, used like a function
    """Write one self-contained HTML page about what ran inside a ``with`` block::

        with performance_report(filename="apportion-report.html"):
            x.compute()

    The page holds a summary with the code that opened it, the task stream (a row
    per worker thread, coloured by task group), each pool's units in use over time,
    the bytes each worker received and sent, a table per task group and the
    scheduler's warnings; it opens from a file without a network (docs/performance-report.md).

    As Dask's: ``stacklevel`` picks the frame whose code is shown (1: the one with
    the ``with``). ``mode`` (Bokeh's resources in Dask) other than None or
    ``"inline"`` is ignored with an ``IgnoredOptionWarning``: the page embeds all it
    uses. Remote files (``storage_options``, ``s3://...``) are refused.
    """

    def __init__(
        self,
        filename: str | Path = "apportion-report.html",
        stacklevel: int = 1,
        mode: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if storage_options or "://" in str(filename):
            raise ValueError(
                f"performance_report writes local files only, not {filename!r} with "
                f"storage_options={storage_options!r}"
            )
        if mode not in (None, "inline"):
            warnings.warn(
                f"performance_report(mode={mode!r}) ignored: the page always embeds "
                "everything it uses",
                IgnoredOptionWarning,
                stacklevel=2,
            )
        super().__init__(None)
        #: Where the page is written on exit.
        self.path = Path(filename)
        self._stacklevel = stacklevel
        self._code: dict[str, Any] | None = None

    def _opened(self, depth: int) -> None:
        try:
            frame: FrameType | None = sys._getframe(depth + self._stacklevel - 1)
        except ValueError:  # a stacklevel above the outermost frame
            frame = None
        self._code = code_location(frame)

    def _finish(self, before: Snapshot, after: Snapshot) -> None:
        records, offset, missing = _records(before, after)
        warn_dropped(missing, stacklevel=4)
        data = report_page.report_data(
            records,
            (before[1], after[1]),
            offset,
            after[0],
            before[0],
            dropped=missing,
            code=self._code,
        )
        self.path.write_text(report_page.render(data), encoding="utf-8")


def code_location(frame: FrameType | None) -> dict[str, Any] | None:
    """Where ``frame`` is, with the source of the block starting at its line (the
    ``with`` statement and the lines indented under it), as far as it can be read."""
    if frame is None:
        return None
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    lines = linecache.getlines(filename, frame.f_globals)[lineno - 1 :]
    return {
        "filename": filename,
        "lineno": lineno,
        "function": frame.f_code.co_name,
        "source": textwrap.dedent("".join(_block(lines)[:MAX_SOURCE_LINES])),
    }


def _block(lines: list[str]) -> list[str]:
    """The first line and those after it indented deeper (blank ones included)."""
    if not lines:
        return []
    depth = len(lines[0]) - len(lines[0].lstrip())
    block = [lines[0]]
    for line in lines[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= depth:
            break
        block.append(line)
    while len(block) > 1 and not block[-1].strip():
        block.pop()
    return block
