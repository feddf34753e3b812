"""An event loop on a background thread, for the synchronous faces of async services.

``Client``, ``LocalCluster`` and the sync context managers of ``Scheduler`` and
``Worker`` all run their asyncio code on one of these, so a user's script or
notebook never needs an event loop of its own. The other way round, ``in_thread``
lets a running loop await a blocking step (starting a ``LocalCluster``, a restart).
Here, below both the client and deployment, since both need them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: Every event loop a ``LoopThread`` runs (weakly: a stopped one goes when dropped).
_OURS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


class LoopThread:
    """A daemon thread running an asyncio loop until ``stop``."""

    def __init__(self, name: str = "apportion-loop") -> None:
        self.loop = asyncio.new_event_loop()
        _OURS.add(self.loop)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # Let cancelled tasks see their cancellation before the loop goes away.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    @property
    def ident(self) -> int | None:
        """The identity of the thread running the loop (set once it started)."""
        return self._thread.ident

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; its outcome arrives in the returned future."""
        if not self._thread.is_alive() or self.loop.is_closed():
            coro.close()  # a stopped loop would never run it: fail instead of hanging
            raise RuntimeError("the event loop has stopped")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result from this (other) thread.

        A wait that ends early (timeout, KeyboardInterrupt) cancels ``coro``: nobody
        is left to take its outcome.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop; await instead")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise
        finally:
            # The future holds the exception, whose traceback holds this frame: a
            # cycle that would keep everything the failed work held (futures, results)
            # until the garbage collector runs.
            del future

    def call(self, func: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """``func(*args)`` called on the loop, a coroutine it gives awaited there; its
        outcome, waited for from this (other) thread."""

        async def called() -> Any:
            outcome = func(*args)
            return await outcome if inspect.isawaitable(outcome) else outcome

        return self.run(called(), timeout)

    def stop(self) -> None:
        """Stop the loop and join the thread; idempotent."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout=10)


def in_running_loop() -> bool:
    """True when called from a coroutine (or a callback) of a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def within(outcome: Awaitable[T], timeout: float | None) -> T:
    """``outcome`` awaited, within ``timeout`` seconds (``TimeoutError`` after)."""
    async with asyncio.timeout(timeout):
        return await outcome


def is_apportion_loop(loop: object) -> bool:
    """``loop`` is the event loop of one of apportion's loop threads (a client's,
    ``Client.loop``, or a cluster's)."""
    return isinstance(loop, asyncio.AbstractEventLoop) and loop in _OURS


def on_loop_thread(thread: LoopThread | None) -> bool:
    """Called from ``thread``'s own loop (where blocking on it would never end)."""
    return thread is not None and threading.current_thread().ident == thread.ident


def call_in_loop(
    loop: asyncio.AbstractEventLoop | None, func: Callable[[], T], timeout: float
) -> T:
    """``func()`` run on ``loop``'s thread and its outcome given here, for reading
    state that only that loop changes (a scheduler's, from a notebook's thread).

    Run here at once when this is that loop's thread, or when the loop is not
    running: nothing changes the state then. ``TimeoutError`` if the loop does not
    get to it within ``timeout`` seconds.
    """
    if loop is None or loop.is_closed() or not loop.is_running():
        return func()
    with contextlib.suppress(RuntimeError):  # no running loop here
        if asyncio.get_running_loop() is loop:
            return func()
    outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if outcome.set_running_or_notify_cancel():
            try:
                outcome.set_result(func())
            except BaseException as exc:
                outcome.set_exception(exc)

    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError:  # closed meanwhile: nothing changes the state any more
        return func()
    try:
        return outcome.result(timeout)
    except concurrent.futures.TimeoutError:
        outcome.cancel()
        raise TimeoutError(f"the event loop did not answer within {timeout}s") from None


async def in_thread(func: Callable[[], T], name: str) -> T:
    """Run a blocking ``func`` on a thread of its own; wait for it here.

    For lifecycle steps that wait on processes and have no event to await (starting
    and stopping a ``LocalCluster``): one short-lived thread per step, gone when it
    ends, never a pool that stays.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def report(setter: Callable[[Any], None], value: Any) -> None:
        if not done.done():
            setter(value)

    def run() -> None:
        try:
            outcome: tuple[Callable[[Any], None], Any] = (done.set_result, func())
        except BaseException as exc:
            outcome = (done.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the caller's loop closed: nobody waits
            loop.call_soon_threadsafe(report, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


class Service(Protocol):
    async def start(self) -> Any: ...

    async def close(self) -> None: ...


S = TypeVar("S", bound=Service)


class BackgroundService:
    """Mixin: ``with service:`` runs an async ``start``/``close`` service on its own thread.

    Lets plain scripts use ``with Scheduler(port=0) as s:`` and ``with Worker(addr) as w:``
    without an event loop of their own; inside a loop, use ``async with`` instead.
    """

    _loop_thread: LoopThread | None = None

    def __enter__(self: S) -> S:
        thread = LoopThread(f"apportion-{type(self).__name__.lower()}")
        try:
            thread.run(self.start())
        except BaseException:
            thread.stop()
            raise
        self._loop_thread = thread  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        thread, self._loop_thread = self._loop_thread, None
        if thread is not None:
            try:
                thread.run(self.close(), timeout=30)  # type: ignore[attr-defined]
            finally:
                thread.stop()
