"""``client.get_executor()``: the cluster as a ``concurrent.futures.Executor``.

Code written against the standard library (``executor.submit``, ``executor.map``,
``concurrent.futures.wait`` and ``as_completed``, ``with executor:``) runs on the
cluster unchanged. Each call is a task; the keywords given to ``get_executor``
(resources, priority, retries, workers, pure) apply to every task, as Dask's
executor applies them.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from apportion.client.future import Future, FutureOwner
from apportion.client.results import Gathered
from apportion.client.state import CANCELLED, FINISHED
from apportion.core.durations import Duration, seconds


class Submitter(Protocol):
    """What an executor needs of its client (a ``Client``)."""

    def submit(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Future: ...

    def map(self, func: Callable[..., Any], *iterables: Iterable[Any], **kwargs: Any) -> Any: ...

    def cancel(self, futures: Any) -> Any: ...


#: Keywords an executor passes on to every task it submits.
TASK_KEYWORDS = frozenset(
    {"pure", "workers", "resources", "allow_other_workers", "retries", "priority"}
)


class ClientExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` whose calls run as tasks of one client."""

    def __init__(self, client: Submitter, **task_keywords: Any) -> None:
        unknown = set(task_keywords) - TASK_KEYWORDS
        if unknown:
            raise TypeError(
                f"unsupported arguments to ClientExecutor: {sorted(unknown)} (get_executor "
                f"does not take them; it takes {sorted(TASK_KEYWORDS)})"
            )
        self._client = client
        self._keywords = task_keywords
        #: Tasks of ``map``, and the standard futures ``submit`` returned.
        self._futures: weakref.WeakSet[Future] = weakref.WeakSet()
        self._returned: weakref.WeakSet[cf.Future[Any]] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Run ``fn(*args, **kwargs)`` as a task; a standard-library future of its result."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            # A keyword given here wins over the executor's (``pure=False`` on both is
            # fine), as Dask's executor merges them.
            future = self._client.submit(fn, *args, **{**self._keywords, **kwargs})
            outer = _wrap(future)
            self._returned.add(outer)
        return outer

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: Duration | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        """Results of ``fn`` over the zipped iterables, in order; every task is
        submitted before the first result is asked for. ``chunksize`` and
        ``buffersize`` are accepted for the standard signature: the client batches
        submissions by itself."""
        limit = seconds(timeout)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            futures = self._client.map(fn, *iterables, **self._keywords)
            self._futures.update(futures)
        deadline = None if limit is None else time.monotonic() + limit
        return self._results(futures, deadline)

    def _results(self, futures: list[Future], deadline: float | None) -> Iterator[Any]:
        try:
            for i, future in enumerate(futures):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    yield future.result(left)
                except TimeoutError:
                    raise cf.TimeoutError() from None
                futures[i] = None  # type: ignore[call-overload]  # let its result go
        finally:
            left_over = [f for f in futures if f is not None and not f.done()]
            if left_over:
                self._client.cancel(left_over)  # abandoned: as the standard executors do

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new submissions; ``wait`` for the submitted tasks to finish, or (with
        ``cancel_futures`` or ``wait=False``, as Dask's executor) cancel them."""
        with self._lock:
            self._shutdown = True
            futures = list(self._futures)
            returned = list(self._returned)
        if cancel_futures or not wait:
            self._client.cancel([f for f in futures if not f.done()])
            for outer in returned:
                outer.cancel()  # cancels its task too
            return
        for future in futures:
            future._key_state.event.wait()
        # The standard futures themselves: each is set after its result is fetched.
        cf.wait(returned)


class _Unopened:
    """A task's result as fetched, still pickled: unpickled once, by the first thread
    that takes it from the standard future (``results.loads_here`` says why not on
    the callback thread that fetched it)."""

    __slots__ = ("_fetched", "_lock", "_owner", "_value", "key")

    def __init__(self, fetched: Gathered, owner: FutureOwner, key: str) -> None:
        self._fetched: Gathered | None = fetched
        self._owner = owner
        self.key = key
        self._value: Any = None
        self._lock = threading.Lock()

    def open(self) -> Any:
        with self._lock:
            if self._fetched is not None:
                self._value = self._fetched.by_key(self._owner)[self.key]
                self._fetched = None  # the bytes go once the value is made
            return self._value


class _Following(cf.Future[Any]):
    """The standard future of one task: its result is unpickled by whoever takes it.

    A failure is set as the standard futures set it, an exception (``wait`` with
    ``FIRST_EXCEPTION`` looks for one), so it is rebuilt on the callback thread.
    """

    def result(self, timeout: float | None = None) -> Any:
        value = super().result(timeout)
        return value.open() if isinstance(value, _Unopened) else value


def _wrap(future: Future) -> cf.Future[Any]:
    """A standard-library future that follows ``future``; cancelling it cancels the task."""
    outer: cf.Future[Any] = _Following()

    def cancel_task(done: cf.Future[Any]) -> None:
        if done.cancelled():
            # Waiters (``concurrent.futures.wait``, ``as_completed``) count a cancelled
            # future only once it is notified, which the standard executors do.
            done.set_running_or_notify_cancel()
            if not future.done():
                future.cancel()

    def follow(settled: Future) -> None:
        if outer.done():
            return  # cancelled from outside
        if settled.status == CANCELLED:
            outer.cancel()  # ``cancel_task`` notifies its waiters
            return
        with contextlib.suppress(cf.InvalidStateError):  # cancelled meanwhile
            if settled.status == FINISHED:
                try:
                    fetched = settled._client._gather_pickled([settled.key])
                except BaseException as exc:  # the result could not be fetched
                    outer.set_exception(exc)
                else:
                    outer.set_result(_Unopened(fetched, settled._client, settled.key))
            else:
                outer.set_exception(settled.exception())

    outer.add_done_callback(cancel_task)
    future.add_done_callback(follow)
    return outer
