"""Futures: handles on results that live in the cluster.

Every ``Future`` for one key shares a ``KeyState`` held by the client: the key's
record in the client's ``ClientState`` (state.py: status, error, references), and
an event and callbacks to wait on. The loop thread wakes it as that state settles
the key; user threads wait on it. When the last ``Future`` for a key is
garbage-collected, the state says to release it, and the client tells the
scheduler. A future knows its client only as a ``FutureOwner``.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures as cf
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Generator, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from apportion.client.asynchronous import settled
from apportion.client.errors import failure
from apportion.client.result_types import result_class
from apportion.client.standard_waiting import StandardWaiting, standard_waiting
from apportion.client.state import CANCELLED, KeyRecord
from apportion.client.state import Failure as KeyFailure
from apportion.core import payload
from apportion.core.durations import Duration, seconds
from apportion.core.payload import Pickled
from apportion.core.tracebacks import user_frames

if TYPE_CHECKING:
    from apportion.client.link import ClientLink

logger = logging.getLogger("apportion.client")

#: Held while a ``KeyState`` makes its event, so that two threads make one.
_EVENTS_MADE = threading.Lock()


class KeyState:
    """The waiting side of one key, shared by all its futures: an event to wait on.
    What the key is (status, error, futures alive, callbacks to run) is its
    ``KeyRecord`` in the client's ``ClientState``; the client wakes this when that
    state says the key settled, and re-arms it when it is pending again."""

    __slots__ = ("_add", "_event", "_settled", "key", "record")

    def __init__(
        self, key: str, record: KeyRecord, add: Callable[[str, Callable[[], None]], bool]
    ) -> None:
        self.key = key
        self.record = record
        #: Settled (as ``wake`` and ``rearm`` say); the event mirrors it once made.
        self._settled = False
        #: Made by the first thread that waits (``event``): most futures of a big
        #: ``map`` are gathered, never waited on one by one, and an event apiece
        #: costs more than the rest of a future.
        self._event: threading.Event | None = None
        #: The client's ``ClientState.add_callback``, taken under the client's lock:
        #: "not settled, so kept" and "settled, so handed out" are then one step each.
        self._add = add

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def refs(self) -> int:
        return self.record.refs

    @property
    def exception(self) -> BaseException | None:
        """The task's exception once it failed (as Dask's ``FutureState``), else None."""
        return self.exception_object()

    @property
    def traceback(self) -> TracebackType | None:
        """The worker's traceback of that exception, else None."""
        exc = self.exception_object()
        return None if exc is None else exc.__traceback__

    @property
    def event(self) -> threading.Event:
        """Set while the key is settled: what a thread waits on."""
        event = self._event
        if event is None:
            with _EVENTS_MADE:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
                    # After publishing it: a ``wake`` that did not see it set
                    # ``_settled`` first, and is seen here.
                    if self._settled:
                        event.set()
        return event

    def done(self) -> bool:
        """True once the key settled: finished, failed, cancelled or lost."""
        return self._settled

    def __repr__(self) -> str:
        return f"<FutureState: {self.status}, key: {self.key}>"

    def wake(self, callbacks: Iterable[Callable[[], None]] = ()) -> None:
        """The key settled (its record says how): wake its waiters, then run the
        callbacks its settling handed out."""
        self._settled = True
        event = self._event
        if event is not None:
            event.set()
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Register ``callback`` for when the key settles; False if it already has
        (the caller runs it)."""
        return self._add(self.key, callback)

    def rearm(self) -> None:
        """The key is pending again (recomputed, retried, resubmitted): wait again."""
        self._settled = False
        event = self._event
        if event is not None:
            event.clear()

    def exception_object(self) -> BaseException | None:
        """The key's failure as an exception (unpickled here), or None."""
        failed = self.failed()
        return None if failed is None else failed.exception()

    def failed(self) -> Failed | None:
        """The key's failure as it stands now, still pickled, or None: for work on
        the client's loop to hand to the thread that asked (see ``Failed``)."""
        error = self.record.error
        return None if error is None else Failed(error, self.record.attempts)


class Failed:
    """A key's failure, its exception still pickled.

    Work on the client's loop thread hands this to the thread that asked, which
    unpickles it (``exception``): an exception's class may live in a module that
    thread is importing at that moment, and only that thread can then see the
    module whole (``results.loads_here`` says why).
    """

    __slots__ = ("attempts", "error")

    def __init__(self, error: KeyFailure, attempts: int) -> None:
        self.error = error
        self.attempts = attempts

    def exception(self) -> BaseException:
        kind, detail, tb = self.error
        if kind == "exception" and not isinstance(detail, str):
            exc = rebuild_exception(detail, tb)
            if self.attempts > 1:
                exc.add_note(
                    f"apportion: the task raised on each of its {self.attempts} attempts; "
                    "this is the last exception"
                )
            return exc
        return failure(kind, str(detail))

    def throw(self) -> None:
        """Raise the exception (without the cycle a local would make with it)."""
        exc = self.exception()
        try:
            raise exc
        finally:
            del exc


def rebuild_exception(exc_bytes: Pickled, tb_bytes: Pickled) -> BaseException:
    """The task's own exception, with the traceback it had on the worker."""
    try:
        exc = payload.loads(exc_bytes)
    except Exception as err:  # the class may not exist on this side
        return RuntimeError(f"task raised an exception that cannot be unpickled here: {err!r}")
    if not isinstance(exc, BaseException):
        return RuntimeError(f"task raised {exc!r}")
    if tb_bytes:
        try:
            tb = _detached_traceback(payload.loads(tb_bytes))
        except Exception:  # a mangled traceback must not hide the exception itself
            tb = None
        if tb is not None:
            # The worker trimmed its own frames already; one of another version
            # may not have.
            exc = exc.with_traceback(user_frames(tb))
    return exc


def _detached_traceback(tb_dict: Any) -> TracebackType | None:
    """The worker's traceback, rebuilt as real frames on a thread of its own.

    The frames tblib builds chain back (``f_back``) through the frames that built
    them. Built here, on the caller's stack, any caller keeping the exception in a
    local would form a cycle with it, and the futures in those frames would wait
    for the garbage collector, keeping their results (errors) on the scheduler.
    """
    box: list[TracebackType] = []
    thread = threading.Thread(target=_build_traceback, args=(tb_dict, box))
    thread.start()
    thread.join()
    return box.pop() if box else None


def _build_traceback(tb_dict: Any, box: list[TracebackType]) -> None:
    from tblib import Traceback

    with contextlib.suppress(Exception):  # the caller goes on without it
        box.append(Traceback.from_dict(tb_dict).as_traceback())


class FutureOwner(Protocol):
    """What a future needs of its client (a ``Client``): counting it, waiting for and
    fetching its result, cancelling and retrying it."""

    @property
    def asynchronous(self) -> bool: ...

    @property
    def _closed(self) -> bool: ...

    @property
    def _link(self) -> ClientLink: ...

    @property
    def _callbacks(self) -> CallbackRunner: ...

    def _ref(self, key: str) -> KeyState: ...

    def _unref(self, key: str) -> None: ...

    def retry(self, futures: Any) -> Any: ...

    def cancel(self, futures: Any) -> Any: ...

    def _gather_keys(self, keys: list[str]) -> dict[str, Any]: ...

    async def _gather_keys_awaited(self, keys: list[str]) -> dict[str, Any]: ...

    def _gather_pickled(self, keys: list[str]) -> Any: ...


class Future(cf.Future[Any]):
    """A remote result. Same names as ``distributed.Future``.

    A ``concurrent.futures.Future`` as well, so that the standard library's
    ``wait``, ``as_completed`` and ``asyncio.wrap_future`` take it
    (``standard_waiting`` says how); its own methods are apportion's.
    """

    __slots__ = ("_client", "_key_state", "_released", "_waiting", "key")

    def __init__(self, key: str, client: FutureOwner) -> None:
        # The standard future's ``__init__`` is not called: its lock and lists are
        # made on first use, by ``standard_waiting``.
        self.key = key
        self._client = client
        self._waiting: StandardWaiting | None = None
        self._released = True  # until counted: a failed ``_ref`` must not be undone
        self._key_state = client._ref(key)
        self._released = False

    def __del__(self) -> None:
        self.release()

    def release(self) -> None:
        """Let go of the result now rather than when this future is garbage-collected;
        the cluster drops it once nothing else needs it. Idempotent."""
        client = getattr(self, "_client", None)
        if client is not None and not getattr(self, "_released", True):
            self._released = True
            client._unref(self.key)

    @property
    def client(self) -> Any:
        """The client this future belongs to (a ``Client``)."""
        return self._client

    def retry(self) -> None:
        """Run the task again if it failed (``client.retry`` for this future)."""
        self._client.retry([self])

    def __reduce__(self) -> tuple[Callable[[str], Any], tuple[str]]:
        # Inside task arguments a future stands for its result (see core.payload).
        return payload.reduce_reference(self.key)

    def __dask_tokenize__(self) -> tuple[str, str]:
        """Dask's name for this future in the collections built on it (a persisted
        dataframe's parts): its key, which names its result on the cluster."""
        return ("apportion.Future", self.key)

    @property
    def status(self) -> str:
        """ "pending", "finished", "error", "cancelled" or "lost"."""
        return self._key_state.status

    @property
    def type(self) -> builtins.type | None:
        """The class of the result (as Dask's): None until the task finished, or when
        the class cannot be imported here. Its module is imported by the thread that
        reads this, if need be (``result_types``)."""
        return result_class(self._key_state.record.type_name)

    def done(self) -> bool:
        """True once the task finished, failed or was cancelled."""
        return self._key_state.done()

    def cancelled(self) -> bool:
        return self._key_state.status == CANCELLED

    def result(self, timeout: Duration | None = None) -> Any:
        """The task's return value; re-raises its exception with the worker's traceback.

        Of an asynchronous client, called from its event loop: an awaitable of it, as
        Dask's (``await future`` says the same).
        """
        if self._client.asynchronous:
            return self._result_async(seconds(timeout))
        self._wait(timeout)
        # Raised here, not in a helper: the traceback the user reads is this frame
        # and the task's own (Dask's short tracebacks).
        exc = self._key_state.exception_object()
        if exc is not None:
            try:
                raise exc
            finally:
                del exc  # else this frame and the exception's traceback hold each other
        return self._client._gather_keys([self.key])[self.key]

    def exception(self, timeout: Duration | None = None) -> Any:
        """The exception the task raised, or None if it succeeded (an awaitable of it,
        as ``result``)."""
        if self._client.asynchronous:
            return self._exception_async(seconds(timeout))
        self._wait(timeout)
        return self._key_state.exception_object()

    def traceback(self, timeout: Duration | None = None) -> Any:
        """The worker's traceback of the task's exception, or None (an awaitable of it,
        as ``result``)."""
        if self._client.asynchronous:
            return self._traceback_async(seconds(timeout))
        exc = self.exception(timeout)
        return exc.__traceback__ if exc is not None else None

    def cancel(self) -> Any:
        """Cancel the task if it has not finished; dependents fail as cancelled. Done at
        once; an asynchronous client's gives an awaitable as well, as Dask's."""
        return self._client.cancel([self])

    # --- awaiting ---------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Any]:
        """``await future``: the task's return value, or its exception raised, without
        blocking the running loop (for a future of any client)."""
        return self._result_async(None).__await__()

    async def _result_async(self, timeout: float | None) -> Any:
        await self._settled(timeout)
        exc = self._key_state.exception_object()  # raised here, as in ``result``
        if exc is not None:
            try:
                raise exc
            finally:
                del exc
        values = await self._client._gather_keys_awaited([self.key])
        return values[self.key]

    async def _exception_async(self, timeout: float | None) -> BaseException | None:
        await self._settled(timeout)
        return self._key_state.exception_object()

    async def _traceback_async(self, timeout: float | None) -> Any:
        exc = await self._exception_async(timeout)
        return exc.__traceback__ if exc is not None else None

    async def _settled(self, timeout: float | None) -> None:
        """Wait in the running loop until the key has settled."""
        if self._key_state.done():
            return
        try:
            async with asyncio.timeout(timeout):
                await settled(self._key_state)
        except TimeoutError:
            raise TimeoutError(f"{self.key!r} not done after {timeout}s") from None

    def add_done_callback(self, fn: Callable[[Future], Any]) -> None:
        """Call ``fn(self)`` when done; at once, in this thread, if it already is.

        Later calls run on the client's callback thread, one at a time, so ``fn`` may
        call ``result()``; an exception it raises is logged, not lost.
        """
        if self._client.asynchronous and getattr(fn, "__module__", None) == "asyncio.futures":
            # ``asyncio.wrap_future``: its callback would read ``result()`` on the very
            # loop this client runs on, where it is an awaitable, never the value.
            raise TypeError(
                "a future of an asynchronous client is awaited directly (await future), "
                "not wrapped with asyncio.wrap_future"
            )
        runner = self._client._callbacks
        if not self._key_state.add_callback(lambda: runner.submit(fn, self)):
            fn(self)

    # --- what concurrent.futures.wait and as_completed read (standard_waiting.py) -------

    def set_result(self, result: Any) -> None:
        """Refused: the standard future's executor side; the task settles this one."""
        raise RuntimeError("an apportion future is settled by its task, not set_result")

    def set_exception(self, exception: BaseException | None) -> None:
        """Refused, as ``set_result``."""
        raise RuntimeError("an apportion future is settled by its task, not set_exception")

    def set_running_or_notify_cancel(self) -> bool:
        """Refused, as ``set_result``."""
        raise RuntimeError("an apportion future is started by its scheduler, not by this call")

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return standard_waiting(self, self._waiting).condition

    @property
    def _state(self) -> str:  # type: ignore[override]
        return standard_waiting(self, self._waiting).state

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        return standard_waiting(self, self._waiting).waiters

    def _wait(self, timeout: Duration | None) -> None:
        if not self._key_state.event.wait(seconds(timeout)):
            raise TimeoutError(f"{self.key!r} not done after {timeout}s")

    def __repr__(self) -> str:
        return f"<Future: {self.status}, key: {self.key}>"


class CallbackRunner:
    """One daemon thread running done-callbacks, off the client's event loop.

    On the loop they could not call ``result()`` (which needs the loop), and one
    that raised would end the loop's reader and hang every future.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[Future], Any], Future] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[Future], Any], future: Future) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="apportion-callbacks", daemon=True
                )
                self._thread.start()
        self._queue.put((fn, future))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, future = item
            try:
                fn(future)
            except Exception:
                logger.exception("done callback %r for %s raised", fn, future.key)
            # Drop the references before waiting again: kept until the next callback,
            # the last one would pin its future (and whatever ``fn`` holds, such as an
            # abandoned as_completed queue of futures) and so their results.
            del item, fn, future

    def stop(self) -> None:
        self._queue.put(None)
