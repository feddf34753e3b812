"""The live part of the dashboard: status messages as Server-Sent Events, the job
queue's overview shared by every connection, and the JSON both are sent as.

A stream builds one status per beat, on the scheduler's loop (it is cheap and
bounded: ``scheduler/status.py``), with only the task-stream items and warnings
this connection has not been sent yet. It is encoded off the loop, then written;
the next is built only once the last has drained to the socket, so a slow reader
skips beats instead of piling up messages, and one whose unsent bytes pass
``MAX_UNSENT`` anyway is dropped. Nothing is built while no page is connected.

The job queue's overview reads the journal file: in a thread, at most every
``RUNS_MAX_AGE`` seconds, the same copy given to every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger("apportion.scheduler.dashboard")

#: Seconds between messages: the default, and the bounds ``?interval=`` is kept to.
DEFAULT_INTERVAL = 1.0
MIN_INTERVAL = 0.2
MAX_INTERVAL = 10.0
#: Unsent bytes past which a stream's reader is dropped as too slow.
MAX_UNSENT = 4 * 1024 * 1024
#: Seconds the job queue's overview is reused before the journal is read again.
RUNS_MAX_AGE = 2.0


class SchedulerReadout(Protocol):
    """What the dashboard reads of its scheduler, on the scheduler's loop
    (``apportion.scheduler.readout.Readout``)."""

    def status(self, stream_since: int, events_since: int) -> dict[str, Any]:
        """The status, with the stream items and warnings after the given numbers."""
        ...

    def story(self, key: str) -> dict[str, Any] | None:
        """``{"key", "now", "story"}`` of ``key``; None if the scheduler knows nothing of it."""
        ...

    def durations(self) -> dict[str, Any]:
        """The task-duration histograms (``status.durations``), for ``/metrics``."""
        ...

    def loop_lag(self) -> tuple[float, float]:
        """Seconds the scheduler's loop woke up late: last, and the recent peak."""
        ...


class RunsSource(Protocol):
    """The job queue's journal, read by blocking calls made in a thread
    (``apportion.runs.overview.JournalOverview``)."""

    def overview(self) -> dict[str, Any]:
        """The ``"runs"`` entry of a status message."""
        ...

    def log_tail(self, run_id: int, tail: int) -> bytes | None:
        """The last ``tail`` bytes of a run's output; None if there is no such run."""
        ...


def to_json(value: Any) -> bytes:
    """Compact JSON on one line; an infinite or NaN number (which JSON cannot carry,
    and browsers refuse) becomes null."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(value), separators=(",", ":"), allow_nan=False)
    return text.encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class RunsCache:
    """The job queue's overview, read in a thread at most every ``max_age`` seconds and
    shared: callers arriving while a read runs wait for that one."""

    def __init__(
        self,
        source: RunsSource | None,
        max_age: float = RUNS_MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.max_age = max_age
        self._clock = clock
        self._value: dict[str, Any] | None = None
        self._read_at = -math.inf
        self._reading: asyncio.Future[dict[str, Any]] | None = None
        self._failed = False

    async def get(self) -> dict[str, Any] | None:
        """The overview (None when the scheduler serves no journal)."""
        if self.source is None:
            return None
        if self._clock() - self._read_at < self.max_age and self._value is not None:
            return self._value
        if self._reading is None:
            self._reading = asyncio.ensure_future(asyncio.to_thread(self.source.overview))
            self._reading.add_done_callback(self._done)
        try:
            # Shielded: one page going away must not cancel the read the others wait for.
            return await asyncio.shield(self._reading)
        except Exception as exc:  # OSError, sqlite3.Error, JournalError: keep what was read
            if not self._failed:
                logger.warning("dashboard: cannot read the run journal: %s", str(exc))
                self._failed = True
            return self._value

    def _done(self, reading: asyncio.Future[dict[str, Any]]) -> None:
        self._reading = None
        self._read_at = self._clock()
        if not reading.cancelled() and reading.exception() is None:
            self._value = reading.result()
            self._failed = False


def clamp_interval(value: float) -> float:
    """``value`` kept within [MIN_INTERVAL, MAX_INTERVAL]."""
    return min(MAX_INTERVAL, max(MIN_INTERVAL, value))


async def stream_status(
    writer: asyncio.StreamWriter,
    readout: SchedulerReadout,
    runs: RunsCache,
    interval: float,
    closing: asyncio.Event,
) -> None:
    """Write ``event: status`` messages to ``writer`` every ``interval`` seconds until
    the reader leaves or ``closing`` is set (the head is written already)."""
    stream_since = events_since = 0
    transport = writer.transport
    while not closing.is_set():
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > MAX_UNSENT:
            logger.warning("dashboard: dropping an event stream whose reader is too slow")
            transport.abort()
            return
        overview = await runs.get()
        doc = readout.status(stream_since, events_since)  # no await between: a snapshot
        doc["runs"] = overview
        stream_since, events_since = doc["stream"]["seq"], doc["events"]["seq"]
        payload = await asyncio.to_thread(to_json, doc)
        if transport.is_closing():
            return
        writer.write(b"event: status\ndata: " + payload + b"\n\n")
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), interval)
