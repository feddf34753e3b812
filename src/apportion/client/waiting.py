"""``wait`` and ``as_completed``, with Dask's names and meanings."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from apportion.client.future import Future

FIRST_COMPLETED = "FIRST_COMPLETED"
ALL_COMPLETED = "ALL_COMPLETED"


class DoneAndNotDone(NamedTuple):
    done: set[Future]
    not_done: set[Future]


def wait(
    fs: Future | Iterable[Future],
    timeout: float | None = None,
    return_when: str = ALL_COMPLETED,
) -> DoneAndNotDone:
    """Block until all (or the first of) ``fs`` are done; raises ``TimeoutError``."""
    futures = [fs] if isinstance(fs, Future) else list(fs)
    if return_when not in (ALL_COMPLETED, FIRST_COMPLETED):
        raise ValueError(f"return_when must be {ALL_COMPLETED} or {FIRST_COMPLETED}")
    deadline = None if timeout is None else time.monotonic() + timeout
    if return_when == ALL_COMPLETED:
        for fut in futures:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not fut._state.event.wait(left):
                raise TimeoutError(f"not all futures finished within {timeout}s")
    elif futures and not any(f.done() for f in futures):
        ready = threading.Event()
        for fut in futures:
            fut.add_done_callback(lambda _f: ready.set())
        if not ready.wait(timeout):
            raise TimeoutError(f"no future finished within {timeout}s")
    done = {f for f in futures if f.done()}
    return DoneAndNotDone(done, set(futures) - done)


class as_completed(Iterator[Any]):
    """Iterate over futures in the order they finish.

    ``with_results=True`` yields ``(future, result)`` pairs. More futures can be
    added while iterating with ``add``.
    """

    def __init__(
        self,
        futures: Iterable[Future] = (),
        with_results: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._queue: queue.SimpleQueue[Future] = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self.with_results = with_results
        self.timeout = timeout
        for fut in futures:
            self.add(fut)

    def add(self, future: Future) -> None:
        with self._lock:
            self._pending += 1
        future.add_done_callback(self._queue.put)

    def count(self) -> int:
        """Futures not yielded yet."""
        return self._pending

    def is_empty(self) -> bool:
        return self._pending == 0

    def __iter__(self) -> as_completed:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._pending == 0:
                raise StopIteration
        try:
            fut = self._queue.get(timeout=self.timeout)
        except queue.Empty:
            # Still pending: counted, so a later ``next`` can yield it.
            raise TimeoutError(f"no future finished within {self.timeout}s") from None
        with self._lock:
            self._pending -= 1
        if self.with_results:
            return fut, fut.result()
        return fut
