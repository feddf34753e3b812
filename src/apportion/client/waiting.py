"""``wait`` and ``as_completed``, with Dask's names and meanings.

For futures of an asynchronous client, from its event loop, both are awaited as
Dask's are (``await wait(futures)``, ``async for future in as_completed(futures)``):
they wait on the loop, never on a thread of their own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any, NamedTuple

from apportion.client import dask_default
from apportion.client.actors import ActorFuture
from apportion.client.asynchronous import settled, wake
from apportion.client.future import Failed, Future
from apportion.client.results import Gathered
from apportion.client.state import ERROR
from apportion.core.durations import Duration, seconds
from apportion.loop_thread import in_running_loop

FIRST_COMPLETED = "FIRST_COMPLETED"
ALL_COMPLETED = "ALL_COMPLETED"


def futures_of(obj: Any) -> list[Future]:
    """Every future in ``obj``: a future, nested lists/tuples/sets/dicts of them, or
    Dask collections persisted on apportion (their parts are futures)."""
    found: list[Future] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, Future):
            found.append(item)
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif hasattr(item, "__dask_graph__") and not isinstance(item, type):
            # A collection, not its class (``futures_of(da.Array)`` holds no future).
            graph = item.__dask_graph__() or {}
            stack.extend(getattr(v, "value", v) for v in graph.values())
    seen: set[int] = set()
    unique = []
    for fut in reversed(found):  # in the order given
        if id(fut) not in seen:
            seen.add(id(fut))
            unique.append(fut)
    return unique


class DoneAndNotDone(NamedTuple):
    done: set[Future]
    not_done: set[Future]


def wait(
    fs: Any,
    timeout: Duration | None = None,
    return_when: str = ALL_COMPLETED,
) -> DoneAndNotDone:
    """Block until all (or the first of) ``fs`` are done; raises ``TimeoutError``.

    ``fs`` is a future, a container of futures, or a persisted Dask collection
    (its parts), as Dask's ``wait`` takes them. For an asynchronous client, from
    its running loop: an awaitable that waits there (``await wait(futures)``).
    """
    if isinstance(timeout, Future):
        raise TypeError(
            "wait takes its futures as one list, wait([x, y]), not wait(x, y): its "
            "second argument is the timeout"
        )
    futures = futures_of(fs)
    if return_when not in (ALL_COMPLETED, FIRST_COMPLETED):
        raise ValueError(f"return_when must be {ALL_COMPLETED} or {FIRST_COMPLETED}")
    timeout = seconds(timeout)
    if _awaited_here(futures):
        return _wait_async(futures, timeout, return_when)  # type: ignore[return-value]
    deadline = None if timeout is None else time.monotonic() + timeout
    if return_when == ALL_COMPLETED:
        for fut in futures:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not fut._key_state.event.wait(left):
                raise TimeoutError(f"not all futures finished within {timeout}s")
    elif futures and not any(f.done() for f in futures):
        ready = threading.Event()
        for fut in futures:
            fut.add_done_callback(lambda _f: ready.set())
        if not ready.wait(timeout):
            raise TimeoutError(f"no future finished within {timeout}s")
    done = {f for f in futures if f.done()}
    return DoneAndNotDone(done, set(futures) - done)


def _awaited_here(futures: list[Future]) -> bool:
    """Called where a client of these futures (given none, the default client) is
    awaited: from an asynchronous client's running loop, or from the client's own
    loop (Dask's rule for giving an awaitable; ``ClientLink.asynchronous``)."""
    if not in_running_loop():
        return False
    if not futures:
        client = dask_default.current()
        return client is not None and client._link.asynchronous
    return any(f._client._link.asynchronous for f in futures)


async def _wait_async(
    futures: list[Future], timeout: float | None, return_when: str
) -> DoneAndNotDone:
    waiting = [settled(f._key_state) for f in futures if not f.done()]
    if waiting:
        when = asyncio.ALL_COMPLETED if return_when == ALL_COMPLETED else asyncio.FIRST_COMPLETED
        _, not_done = await asyncio.wait(waiting, timeout=timeout, return_when=when)
        for left in not_done:
            left.cancel()  # nobody waits for it any more
        if len(not_done) == len(waiting) or (return_when == ALL_COMPLETED and not_done):
            which = "all" if return_when == ALL_COMPLETED else "any of"
            raise TimeoutError(f"not {which} the futures finished within {timeout}s")
    done = {f for f in futures if f.done()}
    return DoneAndNotDone(done, set(futures) - done)


#: What ``as_completed`` yields as they finish: task futures and actor calls alike.
Awaited = Future | ActorFuture


class as_completed(Iterator[Any]):
    """Iterate over futures in the order they finish, as Dask's ``as_completed``.

    ``with_results=True`` yields ``(future, result)`` pairs, the result fetched before
    the pair is yielded; a failed future then raises its exception, or with
    ``raise_errors=False`` is yielded as ``(future, (type, exception, traceback))``
    (a cancelled one as ``(future, exception)``), as Dask yields them. ``timeout``
    counts from the creation of the iterator: once it has passed, ``next`` raises
    ``TimeoutError`` whenever no finished future is waiting. More futures can be
    added while iterating (``add``, ``update``); ``batches()`` yields lists of
    everything finished so far.

    From an event loop, iterate with ``async for`` (needed for an asynchronous
    client's futures, whose plain iteration would block the loop).
    """

    def __init__(
        self,
        futures: Iterable[Awaited] | None = None,
        loop: Any = None,
        with_results: bool = False,
        raise_errors: bool = True,
        *,
        timeout: Duration | None = None,
    ) -> None:
        #: Futures added and not finished yet, with how often each was added.
        self._waiting: dict[Awaited, int] = {}
        #: Finished and not yielded yet: futures, or (future, result) pairs.
        self._ready: deque[Any] = deque()
        self._condition = threading.Condition()
        #: ``async for`` loops waiting for a future to finish: woken from any thread.
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: The links of the futures' clients: where any of them is awaited (from an
        #: asynchronous client's loop, or from a client's own), plain iteration would
        #: block the loop that must deliver the futures.
        self._links: dict[int, Any] = {}
        #: Some actor call belongs to an asynchronous client: plain iteration would block.
        self._asynchronous_actor = False
        self.with_results = with_results
        self.raise_errors = raise_errors
        limit = seconds(timeout)
        self._deadline = None if limit is None else time.monotonic() + limit
        if futures:
            self.update(futures)

    def update(self, futures: Iterable[Awaited]) -> None:
        """Add several futures; each is yielded once it finishes."""
        added = list(futures)
        for fut in added:
            if not isinstance(fut, Future | ActorFuture):
                raise TypeError(
                    f"as_completed takes futures and actor calls' ActorFutures, not "
                    f"{type(fut).__name__}: {fut!r}"
                )
        with self._condition:
            for fut in added:
                self._waiting[fut] = self._waiting.get(fut, 0) + 1
                if isinstance(fut, ActorFuture):
                    self._asynchronous_actor |= fut.asynchronous
                else:
                    self._links.setdefault(id(fut._client), fut._client._link)
        # From a running loop, a finished future's result is fetched on the client's
        # callback thread, as the others are: here it would block that loop. Gathered,
        # not unpickled: the iterating thread unpickles it (``_taken``).
        here = not (self.with_results and in_running_loop())
        for fut in added:
            if isinstance(fut, ActorFuture):
                # Its reply is here once it is done: nothing to fetch, on any thread.
                fut.add_done_callback(self._finished)
                continue
            runner = fut._client._callbacks
            if not fut._key_state.add_callback(partial(runner.submit, self._finished, fut)):
                if here:
                    self._finished(fut)
                else:
                    runner.submit(self._finished, fut)

    def add(self, future: Awaited) -> None:
        """Add one future; it is yielded once it finishes."""
        self.update((future,))

    def _finished(self, future: Awaited) -> None:
        # On the client's callback thread (or the caller's, if already done), so
        # fetching the result here never blocks the iterating thread's order.
        item: Any = future
        if self.with_results:
            item = (future, _prefetched(future))
        with self._condition:
            count = self._waiting.get(future)
            if count is None:
                return  # cleared meanwhile
            if count > 1:
                self._waiting[future] = count - 1
            else:
                del self._waiting[future]
            self._ready.append(item)
            self._condition.notify_all()
            self._wake()

    def _wake(self) -> None:
        """Wake the ``async for`` loops waiting (the condition is held)."""
        wakers, self._wakers = self._wakers, []
        for loop, waiter in wakers:
            wake(loop, waiter)

    def count(self) -> int:
        """Futures not yielded yet: still running, or finished and waiting here."""
        with self._condition:
            return sum(self._waiting.values()) + len(self._ready)

    def is_empty(self) -> bool:
        """Nothing left to yield, now or later."""
        return self.count() == 0

    def has_ready(self) -> bool:
        """Some finished future waits to be yielded."""
        return bool(self._ready)

    def clear(self) -> None:
        """Forget every future, finished or not."""
        with self._condition:
            self._waiting.clear()
            self._ready.clear()
            self._wake()

    def __iter__(self) -> as_completed:
        return self

    def __next__(self) -> Any:
        if in_running_loop() and (
            self._asynchronous_actor or any(link.asynchronous for link in self._links.values())
        ):
            raise RuntimeError(
                "these futures belong to an asynchronous client and plain iteration would "
                "block the running event loop: use 'async for future in as_completed(...)'"
            )
        with self._condition:
            while not self._ready:
                if not self._waiting:
                    raise StopIteration
                left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is not None and left <= 0:
                    # Still counted, so a later ``next`` can yield it.
                    raise TimeoutError("no future finished within the as_completed timeout")
                self._condition.wait(left)
            item = self._ready.popleft()
        return self._taken(item)

    next = __next__

    def __aiter__(self) -> as_completed:
        return self

    async def __anext__(self) -> Any:
        """The next finished future (or pair), waiting in the running loop."""
        loop = asyncio.get_running_loop()
        while True:
            with self._condition:
                if self._ready:
                    item = self._ready.popleft()
                    break
                if not self._waiting:
                    raise StopAsyncIteration
                waiter: asyncio.Future[None] = loop.create_future()
                self._wakers.append((loop, waiter))
            left = None if self._deadline is None else self._deadline - time.monotonic()
            try:
                if left is not None and left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    await waiter
            except TimeoutError:
                raise TimeoutError("no future finished within the as_completed timeout") from None
        return self._taken(item)

    def _taken(self, item: Any) -> Any:
        """What is yielded for ``item``: with results, the pair, its result unpickled
        here, on the iterating thread (``results.loads_here`` says why); a failure
        raised unless ``raise_errors=False``."""
        if not self.with_results:
            return item
        future, outcome = item
        if isinstance(future, ActorFuture):
            return future, self._actor_outcome(future)
        if isinstance(outcome, Gathered):
            return future, outcome.by_key(future._client)[future.key]
        if isinstance(outcome, _Failure):
            exc = outcome.failed.exception()
            if outcome.status != ERROR:
                return future, exc
            if self.raise_errors:
                try:
                    raise exc
                finally:
                    del exc
            return future, (type(exc), exc, exc.__traceback__)
        raise outcome  # the fetch itself failed (the result was lost meanwhile)

    def _actor_outcome(self, future: ActorFuture) -> Any:
        """An actor call's reply, which is already here: its value, or its failure
        raised (or, with ``raise_errors=False``, as Dask's triple)."""
        exc = future.exception()
        if exc is None:
            return future.result()
        if self.raise_errors:
            raise exc
        return (type(exc), exc, exc.__traceback__)

    def next_batch(self, block: bool = True) -> list[Any]:
        """Everything finished so far; with ``block``, wait for at least one."""
        batch = [next(self)] if block else []
        with self._condition:
            items, self._ready = list(self._ready), deque()
        batch.extend(self._taken(item) for item in items)
        return batch

    def batches(self) -> Iterator[list[Any]]:
        """Lists of futures (or pairs) as they finish, as many at once as are ready."""
        while True:
            try:
                yield self.next_batch(block=True)
            except StopIteration:
                return

    def __repr__(self) -> str:
        return f"<as_completed: waiting={len(self._waiting)} done={len(self._ready)}>"


class _Failure(NamedTuple):
    """A finished future's failure, still pickled, and its status then."""

    failed: Failed
    status: str


def _prefetched(future: Awaited) -> Gathered | _Failure | Exception | None:
    """On the callback thread: what the future's pair will hold, fetched but not
    unpickled; an error from the fetch itself, to raise to the iterating thread.
    Nothing for an actor call, whose reply is already here."""
    if isinstance(future, ActorFuture):
        return None
    failed = future._key_state.failed()
    if failed is not None:
        return _Failure(failed, future.status)
    try:
        fetched: Gathered = future._client._gather_pickled([future.key])
    except Exception as exc:
        return exc
    return fetched
