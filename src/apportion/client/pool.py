"""``apportion.Pool``: ``multiprocessing.Pool``'s methods, each call a task on the cluster.

Code written for the standard pool moves to a cluster by changing its import::

    from apportion import Pool          # was: from multiprocessing import Pool

    with Pool(resources={"GPU": 1}) as pool:
        scores = pool.map(train, configs)

What holds as in ``multiprocessing``: ``map`` and ``imap`` give results in the order
of their inputs, ``imap_unordered`` as they finish; ``get`` re-raises the call's own
exception (with the worker's traceback) and raises ``multiprocessing.TimeoutError``
when its timeout passes; a closed or terminated pool raises ``ValueError("Pool not
running")``; ``join`` needs ``close`` or ``terminate`` first; leaving a ``with`` block
terminates the pool (its unfinished calls are cancelled), as the standard one does;
but where the standard pool's result of a call that never started waits for ever,
here it is ready and ``get`` raises ``CancelledError``.

What differs: the calls run on the cluster's workers, not in child processes of this
one. ``processes`` is not a number of processes to start but the most of this pool's
calls that run at once (default: no limit beyond the cluster's own threads and
resources). ``initializer(*initargs)`` runs once in each worker process before the
first call of this pool there. ``chunksize`` makes each task run that many calls in
turn (default 1: the scheduler balances single calls well). Iterables are read
whole when a method is called. ``maxtasksperchild`` and ``context`` are about child
processes and are refused unless None.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import multiprocessing
import queue
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from apportion.client.executor import TASK_KEYWORDS

if TYPE_CHECKING:
    from apportion.client.client import Client
    from apportion.client.future import Future

#: Keywords of ``client.submit`` a pool passes to every task (each call runs, even
#: one equal to another: no ``pure``).
POOL_KEYWORDS = TASK_KEYWORDS - {"pure"}

#: The pools whose initializer ran in this (worker) process.
_initialized: set[str] = set()
_initializing = threading.Lock()


def run_chunk(
    func: Callable[..., Any],
    chunk: Sequence[Any],
    star: bool,
    pool_id: str,
    initializer: Callable[..., Any] | None,
    initargs: Sequence[Any],
) -> list[Any]:
    """One task: the pool's initializer once per process, then ``func`` over ``chunk``."""
    if initializer is not None and pool_id not in _initialized:
        with _initializing:
            if pool_id not in _initialized:
                initializer(*initargs)
                _initialized.add(pool_id)
    if star:
        return [func(*args) for args in chunk]
    return [func(item) for item in chunk]


class _Task:
    """One task of a pool, started now or once the pool's limit lets it."""

    __slots__ = ("args", "future", "on_settled", "started")

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args
        self.future: Future | None = None
        self.started = threading.Event()
        #: Called (on the client's callback thread) once the task settled.
        self.on_settled: Callable[[_Task], None] | None = None


class _Feeder:
    """Starts a pool's tasks, at most ``limit`` unsettled at once (None: all at once).

    Queued tasks start from the client's callback thread as earlier ones settle.
    """

    def __init__(self, client: Client, limit: int | None, keywords: Mapping[str, Any]) -> None:
        self._client = client
        self._limit = limit
        self._keywords = {**keywords, "pure": False}  # every call runs, even if equal
        self._lock = threading.Lock()
        #: Notified when the last unsettled task settles (``Pool.join``).
        self._idle = threading.Condition(self._lock)
        self._queued: deque[_Task] = deque()
        self._running = 0
        #: Every task given, for ``terminate`` (settled ones drop out in ``_settled``).
        self._unsettled: set[_Task] = set()

    def add(self, args: tuple[Any, ...], on_settled: Callable[[_Task], None] | None) -> _Task:
        task = _Task(args)
        task.on_settled = on_settled
        with self._lock:
            self._unsettled.add(task)
            start = self._limit is None or self._running < self._limit
            if start:
                self._running += 1
            else:
                self._queued.append(task)
        if start:
            self._start(task)
        return task

    def _start(self, task: _Task) -> None:
        name = getattr(task.args[0], "__name__", "call")
        future = self._client.submit(
            run_chunk, *task.args, key=f"{name}-{self._client._unique_name()}", **self._keywords
        )
        task.future = future
        task.started.set()
        future.add_done_callback(lambda _: self._settled(task))

    def _settled(self, task: _Task) -> None:
        with self._lock:
            self._unsettled.discard(task)
            if not self._unsettled:
                self._idle.notify_all()
            following = self._queued.popleft() if self._queued else None
            if following is None:
                self._running -= 1
        if following is not None:
            self._start(following)
        if task.on_settled is not None:
            task.on_settled(task)

    def cancel_all(self) -> None:
        """Queued tasks never start (they settle now, as cancelled); started ones are
        cancelled."""
        with self._lock:
            dropped = list(self._queued)
            self._queued.clear()
            started = [t.future for t in self._unsettled if t.future is not None]
            self._unsettled.clear()
            self._idle.notify_all()
        pending = [f for f in started if not f.done()]
        if pending:
            self._client.cancel(pending)
        for task in dropped:
            task.started.set()  # with no future: those waiting on it learn it never ran
            if task.on_settled is not None:
                task.on_settled(task)

    def wait_all(self) -> None:
        """Until every task given has settled (or was dropped by ``cancel_all``)."""
        with self._lock:
            while self._unsettled:
                self._idle.wait()


class AsyncResult:
    """The outcome of ``apply_async`` or ``map_async``, as ``multiprocessing``'s."""

    def __init__(
        self,
        pool: Pool,
        count: int,
        single: bool,
        callback: Callable[[Any], Any] | None,
        error_callback: Callable[[BaseException], Any] | None,
    ) -> None:
        self._pool = pool
        self._single = single
        self._callback = callback
        self._error_callback = error_callback
        self._tasks: list[_Task] = []
        #: Tasks not settled, plus one until ``_tasks`` is set (``armed``): a task may
        #: settle before the list of them is complete.
        self._left = count + 1
        self._lock = threading.Lock()
        self._ready = threading.Event()

    def armed(self, tasks: list[_Task]) -> None:
        """Its tasks, all given to the feeder."""
        self._tasks = tasks
        self._one_settled()

    def _one_settled(self, _task: object = None) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._settle()

    def _settle(self) -> None:
        self._ready.set()
        if self._callback is None and self._error_callback is None:
            return
        try:
            value = self.get(0)
        except BaseException as exc:
            if self._error_callback is not None:
                self._error_callback(exc)
        else:
            if self._callback is not None:
                self._callback(value)

    def ready(self) -> bool:
        """Every call of it has ended (well or not)."""
        return self._ready.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until ready, or until ``timeout`` seconds have passed."""
        self._ready.wait(timeout)

    def successful(self) -> bool:
        """No call of it raised; ``ValueError`` if it is not ready yet."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return all(t.future is not None and t.future.status == "finished" for t in self._tasks)

    def get(self, timeout: float | None = None) -> Any:
        """The result (a list for ``map_async``); the first failing call's exception
        raised; ``multiprocessing.TimeoutError`` when not ready in ``timeout`` seconds."""
        if not self._ready.wait(timeout):
            raise multiprocessing.TimeoutError(f"not ready after {timeout}s")
        # A call terminate kept from starting raises, where the standard pool's
        # result would wait for ever.
        futures = [_started(t) for t in self._tasks]
        chunks = self._pool._client.gather(futures)
        values = list(itertools.chain.from_iterable(chunks))
        return values[0] if self._single else values


#: What ``multiprocessing.pool.MapResult`` is called there; here the same class.
MapResult = AsyncResult


class Pool:
    """``multiprocessing.Pool`` over a cluster (see the module's docstring).

    ``client``: the client whose cluster runs the calls (default: the current one,
    or ``Client()``, an embedded local cluster, if none is open). ``resources``,
    ``priority``, ``retries``, ``workers`` and ``allow_other_workers`` apply to
    every call, as they do to ``client.submit``.
    """

    def __init__(
        self,
        processes: int | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: int | None = None,
        context: Any = None,
        *,
        client: Client | None = None,
        **task_keywords: Any,
    ) -> None:
        if processes is not None and processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None or context is not None:
            raise ValueError(
                "apportion.Pool runs calls on the cluster's workers, not in child processes: "
                "maxtasksperchild and context must be None"
            )
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        unknown = set(task_keywords) - POOL_KEYWORDS
        if unknown:
            raise TypeError(
                f"Pool() got unexpected keyword arguments {sorted(unknown)}; it takes "
                f"client and {sorted(POOL_KEYWORDS)}"
            )
        self._client = client if client is not None else _current_or_embedded()
        self._id = uuid.uuid4().hex
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._feeder = _Feeder(self._client, processes, task_keywords)
        self._state = "RUN"

    def __repr__(self) -> str:
        return f"<apportion.Pool state={self._state} client={self._client!r}>"

    # --- one call -------------------------------------------------------------------

    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (), kwds: Any = None) -> Any:
        """``func(*args, **kwds)`` on the cluster; its result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(
        self,
        func: Callable[..., Any],
        args: Iterable[Any] = (),
        kwds: Mapping[str, Any] | None = None,
        callback: Callable[[Any], Any] | None = None,
        error_callback: Callable[[BaseException], Any] | None = None,
    ) -> AsyncResult:
        """``func(*args, **kwds)`` as a task; ``callback(result)`` or
        ``error_callback(exception)`` on the client's callback thread when it ends."""
        call = _Call(func, kwds or {}) if kwds else func
        return self._async(call, [tuple(args)], 1, True, callback, error_callback)

    # --- many calls -----------------------------------------------------------------

    def map(
        self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int | None = None
    ) -> list[Any]:
        """``[func(x) for x in iterable]``, each call on the cluster, in order."""
        result: list[Any] = self.map_async(func, iterable, chunksize).get()
        return result

    def map_async(
        self,
        func: Callable[[Any], Any],
        iterable: Iterable[Any],
        chunksize: int | None = None,
        callback: Callable[[Any], Any] | None = None,
        error_callback: Callable[[BaseException], Any] | None = None,
    ) -> AsyncResult:
        """``map``'s calls, started now; an ``AsyncResult`` of the list."""
        chunks = _chunks(iterable, chunksize)
        return self._async(func, chunks, len(chunks), False, callback, error_callback, False)

    def starmap(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
    ) -> list[Any]:
        """``[func(*args) for args in iterable]``, in order."""
        result: list[Any] = self.starmap_async(func, iterable, chunksize).get()
        return result

    def starmap_async(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
        callback: Callable[[Any], Any] | None = None,
        error_callback: Callable[[BaseException], Any] | None = None,
    ) -> AsyncResult:
        """``starmap``'s calls, started now; an ``AsyncResult`` of the list."""
        chunks = _chunks((tuple(args) for args in iterable), chunksize)
        return self._async(func, chunks, len(chunks), False, callback, error_callback, True)

    def imap(
        self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int = 1
    ) -> Iterator[Any]:
        """Results in the order of ``iterable``, each as soon as it and those before it
        are done (every call starts now)."""
        tasks = self._tasks(func, _chunks(iterable, chunksize), False)
        return self._in_order(tasks)

    def imap_unordered(
        self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int = 1
    ) -> Iterator[Any]:
        """Results as the calls finish (every call starts now)."""
        settled: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        tasks = self._tasks(func, _chunks(iterable, chunksize), False, settled.put)
        return self._as_finished(len(tasks), settled)

    # --- the pool's life ------------------------------------------------------------

    def close(self) -> None:
        """Take no more calls; those given run to their end."""
        self._check_running()
        self._state = "CLOSE"

    def terminate(self) -> None:
        """Take no more calls and cancel those not finished."""
        self._state = "TERMINATE"
        self._feeder.cancel_all()

    def join(self) -> None:
        """Wait for every call given to end; after ``close`` or ``terminate``."""
        if self._state == "RUN":
            raise ValueError("Pool is still running")
        self._feeder.wait_all()

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    # --- the pieces -----------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state != "RUN":
            raise ValueError("Pool not running")

    def _tasks(
        self,
        func: Callable[..., Any],
        chunks: list[list[Any]],
        star: bool,
        on_settled: Callable[[_Task], None] | None = None,
    ) -> list[_Task]:
        self._check_running()
        return [
            self._feeder.add(
                (func, chunk, star, self._id, self._initializer, self._initargs), on_settled
            )
            for chunk in chunks
        ]

    def _async(
        self,
        func: Callable[..., Any],
        chunks: list[Any],
        count: int,
        single: bool,
        callback: Callable[[Any], Any] | None,
        error_callback: Callable[[BaseException], Any] | None,
        star: bool = True,
    ) -> AsyncResult:
        self._check_running()
        result = AsyncResult(self, count, single, callback, error_callback)
        if single:
            chunks = [[chunks[0]]]
        result.armed(self._tasks(func, chunks, star, result._one_settled))
        return result

    def _in_order(self, tasks: list[_Task]) -> Iterator[Any]:
        for task in tasks:
            task.started.wait()
            yield from _started(task).result()

    def _as_finished(self, count: int, settled: queue.SimpleQueue[_Task]) -> Iterator[Any]:
        """The results of ``count`` tasks in the order they settle (each puts itself on
        ``settled`` then, a task dropped by ``terminate`` too)."""
        for _ in range(count):
            yield from _started(settled.get()).result()


def _started(task: _Task) -> Future:
    """The future of a task that was given its turn; ``CancelledError`` if the pool
    was terminated before it started."""
    if task.future is None:
        raise cf.CancelledError("the pool was terminated before this call started")
    return task.future


class _Call:
    """``func`` with keyword arguments, for ``apply_async(func, args, kwds)``."""

    def __init__(self, func: Callable[..., Any], kwds: Mapping[str, Any]) -> None:
        self.func = func
        self.kwds = dict(kwds)
        self.__name__ = getattr(func, "__name__", "call")

    def __call__(self, *args: Any) -> Any:
        return self.func(*args, **self.kwds)


def _chunks(iterable: Iterable[Any], chunksize: int | None) -> list[list[Any]]:
    size = 1 if chunksize is None else chunksize
    if size < 1:
        raise ValueError(f"Chunksize must be 1+, not {size}")
    items = list(iterable)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _current_or_embedded() -> Client:
    from apportion.client.task_client import current_or_embedded

    return current_or_embedded("Pool")
