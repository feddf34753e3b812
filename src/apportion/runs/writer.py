"""The job queue's I/O, on a thread of its own: journal writes and run logs.

The scheduler's event loop never waits for SQLite or a file. The queue hands this
writer what to do, in order: the lifecycle's journal commands, run output, and
calls (reads, submissions, cancel requests) whose answers come back as futures.
The thread takes whatever has gathered, applies it in one transaction (one commit
per batch, not per change), and only then resolves the calls' futures, so that
an answer never runs ahead of the journal.

Output is placed in its run's log by offset (``RunLogs``) and buffered per run,
written when a run has ``FLUSH_BYTES`` waiting or its oldest bytes are
``FLUSH_SECONDS`` old, and whenever the run starts a new attempt or ends.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from apportion.runs import run_events as e
from apportion.runs.journal import Journal

logger = logging.getLogger("apportion.runs")

T = TypeVar("T")

#: A run's buffered output is written once this much has gathered...
FLUSH_BYTES = 1 << 20
#: ...or once its oldest bytes have waited this many seconds.
FLUSH_SECONDS = 0.1
#: At most this many items go into one transaction.
MAX_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class _Output:
    run_id: int
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class _Call:
    function: Callable[[Journal], Any]
    future: Future[Any]


_Item = e.JournalCommand | _Output | _Call | None


class RunLogs:
    """Each run's log: output placed by offset, buffered, written in batches.

    A run's log holds every attempt, one after the other. Workers count output
    offsets from the start of their attempt; the log byte where the current
    attempt began is kept in memory and in ``<id>.base`` beside the log, so that
    output sent again by an adopted run after a restart is written once.
    """

    def __init__(self, journal: Journal, echo: Callable[[bytes], None] | None) -> None:
        self.journal = journal
        self.echo = echo
        #: Log bytes per run, buffered ones included, to place output sent again.
        self._sizes: dict[int, int] = {}
        #: Log byte where each run's current attempt began.
        self._bases: dict[int, int] = {}
        #: Output not yet written, per run, and when its oldest byte came.
        self._pending: dict[int, tuple[bytearray, float]] = {}

    def new_attempt(self, run_id: int, attempts: int) -> None:
        """The run starts again: its output goes after what its log holds."""
        self._write(run_id)
        path = self.journal.log_path(run_id)
        size = path.stat().st_size if path.exists() else 0
        if size and attempts:
            banner = f"\n[apportion: attempt {attempts + 1}]\n".encode()
            self.journal.append_log(run_id, banner)
            size += len(banner)
        self._sizes[run_id] = size
        self._bases[run_id] = size
        if size:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            with open(os.open(path.with_suffix(".base"), flags, 0o600), "w") as base:
                base.write(str(size))

    def forget(self, run_id: int) -> None:
        """The run ended: write what is buffered and drop its bookkeeping."""
        self._write(run_id)
        self._sizes.pop(run_id, None)
        self._bases.pop(run_id, None)
        self.journal.log_path(run_id).with_suffix(".base").unlink(missing_ok=True)

    def add(self, output: _Output, now: float) -> None:
        """Place output sent from ``offset`` of the run's current attempt."""
        run_id = output.run_id
        size = self._sizes.get(run_id)
        if size is None:
            path = self.journal.log_path(run_id)
            size = path.stat().st_size if path.exists() else 0
        offset = self._base(run_id) + output.offset
        data = output.data
        if offset < size:  # sent again after a reconnection: keep the new part
            data = data[size - offset :]
        elif offset > size:
            gap = offset - size
            data = f"\n[apportion: {gap} bytes of output were lost here]\n".encode() + data
        if data:
            buffered = self._pending.get(run_id)
            if buffered is None:
                self._pending[run_id] = (bytearray(data), now)
            else:
                buffered[0].extend(data)
            if self.echo is not None:
                self.echo(data)
        self._sizes[run_id] = max(size, offset + len(output.data))

    def _base(self, run_id: int) -> int:
        base = self._bases.get(run_id)
        if base is None:
            marker = self.journal.log_path(run_id).with_suffix(".base")
            base = int(marker.read_text()) if marker.exists() else 0
            self._bases[run_id] = base
        return base

    def flush(self, now: float, *, everything: bool = False) -> float | None:
        """Write the buffers that are due (all of them if ``everything``); seconds until
        the next one is due, None if nothing is buffered."""
        wait: float | None = None
        for run_id, (data, since) in list(self._pending.items()):
            due = since + FLUSH_SECONDS - now
            if everything or due <= 0 or len(data) >= FLUSH_BYTES:
                self._write(run_id)
            else:
                wait = due if wait is None else min(wait, due)
        return wait

    def _write(self, run_id: int) -> None:
        buffered = self._pending.pop(run_id, None)
        if buffered is not None:
            self.journal.append_log(run_id, buffered[0])  # no copy: a bytearray is fine


class JournalWriter:
    """Carries out the queue's journal and log I/O in order, on its own thread."""

    def __init__(self, journal: Journal, echo: Callable[[bytes], None] | None = None) -> None:
        self.journal = journal
        self.logs = RunLogs(journal, echo)
        self._items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="apportion-journal", daemon=True)
        self._thread.start()

    def write(self, commands: Sequence[e.JournalCommand]) -> None:
        """Apply the lifecycle's journal commands, in order after everything before."""
        for command in commands:
            self._items.put(command)

    def output(self, run_id: int, offset: int, data: bytes) -> None:
        """Place a run's output in its log (``RunOutput``)."""
        self._items.put(_Output(run_id, offset, data))

    def call(self, function: Callable[[Journal], T]) -> Future[T]:
        """Run ``function(journal)`` after everything before; its answer, once committed."""
        future: Future[T] = Future()
        self._items.put(_Call(function, future))
        return future

    def sync(self) -> Future[None]:
        """Resolved once everything handed over before is done and every log written."""

        def flush(_: Journal) -> None:
            self.logs.flush(0.0, everything=True)

        return self.call(flush)

    def close(self) -> None:
        """Finish everything handed over, write every buffer, stop the thread."""
        if self._thread.is_alive():
            self._items.put(None)
            self._thread.join()

    def _serve(self) -> None:
        wait: float | None = None
        while True:
            try:
                first = self._items.get(timeout=wait)
            except queue.Empty:
                wait = self.logs.flush(time.monotonic())
                continue
            items = [first]
            while len(items) < MAX_BATCH:
                try:
                    items.append(self._items.get_nowait())
                except queue.Empty:
                    break
            stop = None in items
            self._apply([item for item in items if item is not None])
            wait = self.logs.flush(time.monotonic(), everything=stop)
            if stop:
                return

    def _apply(self, items: list[_Item]) -> None:
        answers: list[tuple[Future[Any], Any, BaseException | None]] = []
        now = time.monotonic()
        try:
            with self.journal.batch():
                for item in items:
                    self._one(item, now, answers)
        except Exception as failed:
            logger.exception("job queue: the journal could not commit")
            answers = [(future, None, failed) for future, _, _ in answers]
        for future, result, error in answers:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def _one(
        self,
        item: _Item,
        now: float,
        answers: list[tuple[Future[Any], Any, BaseException | None]],
    ) -> None:
        try:
            match item:
                case _Output():
                    self.logs.add(item, now)
                case _Call():
                    try:
                        answers.append((item.future, item.function(self.journal), None))
                    except Exception as error:
                        answers.append((item.future, None, error))
                case None:
                    pass
                case _:
                    self._command(item)
        except Exception:
            logger.exception("job queue: %s failed", type(item).__name__)

    def _command(self, command: e.JournalCommand) -> None:
        journal = self.journal
        match command:
            case e.MarkQueued():
                journal.mark_queued(command.run_ids, command.wall)
            case e.NewAttempt():
                self.logs.new_attempt(command.run_id, command.attempts)
            case e.MarkRunning():
                journal.mark_running(command.run_id, command.worker, command.held, command.wall)
            case e.Requeue():
                journal.requeue(
                    command.run_id, command.reason, command.wall, preempted=command.preempted
                )
            case e.MarkEnded():
                self.logs.forget(command.run_id)
                journal.mark_ended(
                    command.run_id,
                    command.state,
                    command.wall,
                    exit_code=command.exit_code,
                    signal=command.signal,
                    reason=command.reason,
                )
            case e.Note():
                journal.note(command.run_id, command.text, command.wall)
            case e.SetWaiting():
                journal.set_waiting(command.run_id, command.text)
