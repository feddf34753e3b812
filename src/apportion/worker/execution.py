"""Running tasks on a pool of threads, and bringing their outcomes back to the loop.

The pool is a handful of daemon threads reading one queue, not a
``ThreadPoolExecutor``: its threads are joined at interpreter exit, so a user task
stuck in C code would hang a worker that was asked to stop. Outcomes travel back
in batches: the first outcome of a batch schedules one ``call_soon_threadsafe``
wake-up and the rest ride along, so a burst of 1,000 tiny tasks costs the event
loop a few wake-ups, not a thousand.

Each thread has a *row*, the small index its tasks report (``TaskFinished.thread``)
and the task stream draws them on: the pool's threads hold rows ``0 .. nthreads-1``,
one thread per row at any moment. A task that secedes moves its thread to the
lowest free row from ``nthreads`` up, and reports that row, so the thread started
to replace it takes the row it left; a thread leaving frees its row, and one that
stays in the pool after its seceded task ended moves back to a free row under
``nthreads`` if there is one. So rows stay few: ``nthreads`` plus the tasks seceded.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, MutableMapping
from functools import partial
from typing import Any, NamedTuple

import tblib

from apportion.core.payload import Pickled, dumps, loads, unpack_call
from apportion.core.tracebacks import user_frames
from apportion.core.type_names import type_name
from apportion.worker.context import CancelEvent, TaskInterrupted, running_task
from apportion.worker.events import DataInfo, Execute, Seceded
from apportion.worker.memory_policy import MemoryLimits
from apportion.worker.sizeof import sizeof
from apportion.worker.still_pickled import loaded

logger = logging.getLogger("apportion.worker")


class Finished(NamedTuple):
    key: str
    value: Any
    info: DataInfo
    duration: float
    thread: int  #: the row of the thread that ran it (see the module docstring)


class Raised(NamedTuple):
    key: str
    exception: Pickled
    traceback: Pickled
    duration: float
    thread: int
    #: It raised ``TaskInterrupted``: its work was stopped by an interruption.
    interrupted: bool = False


class TooLarge(NamedTuple):
    """The result was larger than the worker keeps (``MemoryLimits.keeps``): dropped."""

    key: str
    info: DataInfo
    limit: int
    largest: int
    duration: float
    thread: int


Outcome = Finished | Raised | TooLarge


class FunctionCache:
    """Pickled functions by id, each unpickled once, on first use, by a task thread.

    Unpickling on first use keeps the receive loop free of user imports; a function
    that fails to load keeps failing with the same error for every task using it.
    """

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._loaded: dict[str, Callable[..., Any] | BaseException] = {}
        self._lock = threading.Lock()

    def add(self, func_id: str, blob: bytes) -> None:
        with self._lock:
            if func_id not in self._loaded:
                self._blobs[func_id] = blob

    def __contains__(self, func_id: object) -> bool:
        return func_id in self._loaded or func_id in self._blobs

    def get(self, func_id: str) -> Callable[..., Any]:
        with self._lock:
            entry = self._loaded.get(func_id)
            if entry is None:
                blob = self._blobs.pop(func_id, None)
                if blob is None:
                    raise RuntimeError(f"function {func_id} was never sent to this worker")
                try:
                    entry = loads(blob)
                except Exception as exc:
                    entry = exc
                self._loaded[func_id] = entry
        if isinstance(entry, BaseException):
            raise entry.with_traceback(None)
        return entry


def pack_exception(exc: BaseException) -> tuple[Pickled, Pickled]:
    """Pickle ``exc`` and its traceback so the client can re-raise the original type.

    An exception that does not survive a pickle round trip (unpicklable attributes, an
    ``__init__`` with extra required arguments) is replaced by a ``RuntimeError``
    carrying its repr and type name: the client must get *an* error, never a hang.
    """
    try:
        blob = dumps(exc)
        loads(blob)
    except Exception:
        name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        blob = dumps(RuntimeError(f"{name}: {exc!r} (the original exception could not be pickled)"))
    tb = user_frames(exc.__traceback__)  # the client wants the user's frames, not ours
    return blob, dumps(tblib.Traceback(tb).to_dict() if tb is not None else None)


class TaskRunner:
    """``nthreads`` threads running ``Execute`` commands; outcomes go to ``deliver``.

    ``deliver`` is called on ``loop`` with a batch of outcomes, after each finished
    value has been stored in ``data`` (on the loop thread, so ``data`` may be any
    mapping, thread-safe or not). ``limits``: the worker's memory limits; a result
    they do not keep is dropped on its thread, as the task returns (``TooLarge``).
    """

    def __init__(
        self,
        nthreads: int,
        data: MutableMapping[str, Any],
        deliver: Callable[[list[Outcome]], None],
        loop: asyncio.AbstractEventLoop,
        worker: Any,
        limits: MemoryLimits | None = None,
    ) -> None:
        self.functions = FunctionCache()
        self._limits = limits
        self._data = data
        #: The data store's way to keep a value whose size is known (``SpillBuffer``),
        #: so that a result is not measured twice; None for a plain mapping.
        self._store_sized: Callable[[str, Any, int], None] | None = getattr(
            data, "store_sized", None
        )
        self._deliver = deliver
        self._loop = loop
        self._worker = worker
        self._queue: queue.SimpleQueue[tuple[Execute, dict[str, Any]] | None] = queue.SimpleQueue()
        self._done: list[Outcome] = []
        self._done_lock = threading.Lock()
        #: Keys submitted or running -> the event their code may watch
        #: (``task_cancel_event``), set when the scheduler no longer wants the result;
        #: None until a cancel or the task asks for it (``cancel_event``).
        self._cancel_events: dict[str, CancelEvent | None] = {}
        self._cancel_lock = threading.Lock()
        self._closed = False
        # Seceded tasks keep their thread, so the pool grows by one for each, and
        # shrinks as they rejoin or end: a thread leaves after its task when more are
        # alive than ``_wanted`` (Dask's rule: briefly more than ``nthreads``).
        self._pool_lock = threading.Lock()
        self._wanted = nthreads
        self._alive = nthreads
        #: The threads started and alive at the last start (a closed runner's are
        #: joined through this).
        self._threads: list[threading.Thread] = []
        self._started = 0
        #: Rows held by threads (under ``_pool_lock``); each thread keeps its own in
        #: ``_local.row``.
        self._nthreads = nthreads
        self._rows: set[int] = set()
        self._local = threading.local()
        for _ in range(nthreads):
            self._start_thread()

    def _start_thread(self) -> None:
        """Start one more thread, on the lowest free row (under ``_pool_lock`` once
        tasks run)."""
        name = f"apportion-task-{self._started}"
        self._started += 1
        row = self._take_row(0)
        thread = threading.Thread(target=self._thread_main, args=(row,), name=name, daemon=True)
        if len(self._threads) > 2 * self._alive + 8:  # amortised: thousands may secede
            self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _take_row(self, lowest: int) -> int:
        """Hold the lowest free row from ``lowest`` up (under ``_pool_lock``)."""
        rows = self._rows
        row = lowest
        while row in rows:
            row += 1
        rows.add(row)
        return row

    def secede(self, key: str, keep_resources: bool) -> None:
        """From the task ``key``'s thread: it waits on other tasks; lend its thread out."""
        with self._pool_lock:
            self._wanted += 1
            row = getattr(self._local, "row", None)
            if row is not None and row < self._nthreads:
                # Off the pool's rows, so that the thread taking over takes this one.
                self._local.row = self._take_row(self._nthreads)
                self._rows.discard(row)
            if not self._closed and self._alive < self._wanted:
                self._alive += 1
                self._start_thread()
        self._worker.post_from_thread(lambda now: Seceded(key, keep_resources, now))

    def rejoin(self, key: str) -> None:
        """From the seceded task ``key``'s thread: wait until it may run on (it holds its
        resources again); ``CancelledError`` if it never will (the worker lost it)."""
        self._worker.wait_to_rejoin(key)
        self._thread_back()

    def _thread_back(self) -> None:
        """A seceded task counts on a thread again, or ended: one thread too many."""
        with self._pool_lock:
            self._wanted -= 1

    def _leave_if_too_many(self) -> bool:
        """After a task: leave (True) if the pool has a thread too many; else stay, on
        a row under ``nthreads`` if this thread was off them and one is free."""
        with self._pool_lock:
            row = self._local.row
            if self._alive > self._wanted:
                self._alive -= 1
                self._rows.discard(row)
                self._local.row = None
                return True
            if row >= self._nthreads:
                lower = self._take_row(0)
                if lower < row:
                    self._rows.discard(row)
                    self._local.row = lower
                else:
                    self._rows.discard(lower)
            return False

    def submit(self, command: Execute, inputs: dict[str, Any]) -> None:
        """Queue ``command``; threads take queued commands in order (the state machine
        hands a few short ones ahead of a free thread: ``WorkerState.started_ahead``)."""
        # The key is known from now on, not from when a thread picks the task up: a
        # cancel that arrives in between must still reach the task.
        self._cancel_events[command.key] = None
        self._queue.put((command, inputs))

    def cancel_event(self, key: str) -> CancelEvent:
        """The cancel event of the submitted or running task ``key``, made on first use
        (from the loop's ``cancel`` or the task's thread, whichever asks first)."""
        with self._cancel_lock:
            event = self._cancel_events.get(key)
            if event is None:
                event = CancelEvent()
                if key in self._cancel_events:
                    self._cancel_events[key] = event
            return event

    def cancel(self, keys: Iterable[str], *, interrupt: bool = False) -> int:
        """Ask the running tasks among ``keys`` to stop; returns how many were running.

        Python code cannot be interrupted safely from outside; a task that watches
        ``task_cancel_event()`` (as command runs do) stops, others run to the end.
        ``interrupt``: the scheduler stops them to run them again later (preemption,
        ``task_interrupted``); a cancel wins over an interruption, asked before or after.
        """
        asked = 0
        for key in keys:
            if key in self._cancel_events:
                event = self.cancel_event(key)
                if not interrupt:
                    event.interrupted = False
                elif not event.is_set():
                    event.interrupted = True
                event.set()
                asked += 1
        return asked

    def close(self) -> None:
        """Stop the threads once their current task returns; do not wait for it."""
        if self._closed:
            return
        self._closed = True
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        with self._pool_lock:
            alive = self._alive
        for _ in range(alive):
            self._queue.put(None)

    def _thread_main(self, row: int) -> None:
        self._local.row = row
        try:
            self._serve_tasks()
        finally:
            with self._pool_lock:
                if self._local.row is not None:  # None: it left, its row freed already
                    self._rows.discard(self._local.row)

    def _serve_tasks(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            outcome = self.run(*item)
            # Neither the inputs nor the result may stay referenced here while this
            # thread waits for its next task: the data store spills and forgets them,
            # and a reference from here would keep their memory in the process, where
            # the store no longer counts it.
            del item
            with self._done_lock:
                self._done.append(outcome)
                first = len(self._done) == 1
            del outcome
            if first:
                try:
                    self._loop.call_soon_threadsafe(self._flush)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return
            if self._leave_if_too_many():
                return

    def run(self, command: Execute, inputs: dict[str, Any]) -> Outcome:
        """Run one task on this thread and describe how it went (row 0 off the pool)."""
        start = time.perf_counter()
        key = command.key
        cancel: CancelEvent | Callable[[], threading.Event]
        cancel = self._cancel_events.setdefault(key, None) or partial(self.cancel_event, key)
        try:
            func = self.functions.get(command.func_id)
            if inputs:
                # Values that arrived from elsewhere are unpickled here, on the task's
                # thread, never on the loop (``still_pickled`` says why); an error
                # doing so is the task's.
                inputs = {key: loaded(value) for key, value in inputs.items()}
            args, kwargs = unpack_call(command.args, inputs)
            del inputs
            with running_task(self._worker, command, cancel, self) as running:
                start = time.perf_counter()
                try:
                    value = func(*args, **kwargs)
                finally:
                    if running.seceded:  # it ended without rejoining, as Dask allows
                        self._thread_back()
            duration = time.perf_counter() - start
        except BaseException as exc:  # user code may raise SystemExit too: report it all
            duration = time.perf_counter() - start
            exception, traceback = pack_exception(exc)
            interrupted = isinstance(exc, TaskInterrupted)
            return Raised(command.key, exception, traceback, duration, self._row(), interrupted)
        finally:
            self._cancel_events.pop(command.key, None)
        # Read as the task ends: a task that seceded reports the row it moved to.
        row = self._row()
        info = DataInfo(sizeof(value), type_name(value))
        limits = self._limits
        if limits is not None and not limits.keeps(info.nbytes):
            # Dropped here, not by the loop: the process is over its threshold while
            # the value lives, and the data store would spend seconds writing it to disk.
            del value
            largest = limits.largest_result or limits.limit
            return TooLarge(command.key, info, limits.limit, largest, duration, row)
        return Finished(command.key, value, info, duration, row)

    def _row(self) -> int:
        """This thread's row; 0 on a thread that is not the pool's."""
        return getattr(self._local, "row", 0)

    def _flush(self) -> None:
        with self._done_lock:
            batch, self._done = self._done, []
        if self._closed or not batch:
            return
        store_sized = self._store_sized
        for outcome in batch:
            if isinstance(outcome, Finished):
                if store_sized is not None:
                    store_sized(outcome.key, outcome.value, outcome.info.nbytes)
                else:
                    self._data[outcome.key] = outcome.value
        self._deliver(batch)
