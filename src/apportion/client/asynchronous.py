"""Awaiting a client's work from the caller's event loop.

Every client, blocking or asynchronous, does its I/O on its session's loop thread
(``LoopThread``). A blocking call waits for that loop on the caller's thread. An
asynchronous call hands the caller a coroutine instead: awaited, it starts the work
on the session's loop and suspends until the outcome comes back through
``call_soon_threadsafe`` (``asyncio.wrap_future``). No thread is parked per call.
Receiving results stays on the session's loop; unpickling them is the caller's, in
its own loop (``results.loads_here`` says why).

Whether a call is asynchronous is decided where it is made, as Dask decides it: a
client made with ``asynchronous=True`` returns awaitables when called from a running
event loop, and blocks when called from a thread that has none (a done-callback,
``asyncio.to_thread``), where blocking harms nobody. Any client's calls made on its
session's own loop (a coroutine run by ``client.sync``) return awaitables too: there,
blocking would stop the loop that does the work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Generator
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from apportion.client.errors import SchedulerGoneError
from apportion.core.tracebacks import trimmed
from apportion.loop_thread import LoopThread

T = TypeVar("T")


async def awaited(
    thread: LoopThread,
    func: Callable[..., Coroutine[Any, Any, T]],
    *args: Any,
    timeout: float | None = None,
) -> T:
    """Run ``func(*args)`` on ``thread``'s loop; wait here, in the running loop.

    ``timeout`` cancels the work there and raises ``TimeoutError``. Work cancelled
    because that loop stopped (the client closed meanwhile) raises
    ``SchedulerGoneError``, not ``CancelledError``: the caller did not cancel it.
    """
    try:
        outcome = thread.submit(func(*args))
    except RuntimeError:
        raise SchedulerGoneError("the client's connection was closed") from None
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await asyncio.wrap_future(outcome)
    except TimeoutError:
        if not deadline.expired():
            raise  # the work's own TimeoutError (a wait it was asked to bound)
        raise TimeoutError(f"not done within {timeout:g}s") from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if outcome.cancelled() and (task is None or not task.cancelling()):
            raise SchedulerGoneError("the client's connection was closed") from None
        raise
    except Exception as exc:
        # A task's failure reaches the awaiting user with the user's frames, not
        # those of the session's loop it came through (core/tracebacks.py).
        try:
            raise trimmed(exc)
        finally:
            del exc
    finally:
        # ``outcome`` holds the exception, whose traceback holds this frame: a cycle
        # that would keep what the failed work held until the garbage collector runs.
        del outcome


class Settling(Protocol):
    """What ``settled`` waits on: a ``KeyState``."""

    def add_callback(self, callback: Callable[[], None]) -> bool: ...


def settled(state: Settling) -> asyncio.Future[None]:
    """A future of the running loop, done once ``state`` has settled (at once if it
    has). The state may settle on any thread; the future is only touched here."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    if not state.add_callback(partial(wake, loop, done)):
        done.set_result(None)
    return done


def wake(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> None:
    """From any thread: resolve ``waiter``, a future of ``loop``, on that loop."""
    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
        loop.call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # a waiter that timed out cancelled it
        waiter.set_result(None)


class Ready(Generic[T]):
    """An awaitable of a value known already: what an asynchronous call returns when
    its work is done at once (a cancel, a close of a closed client). Unlike a
    coroutine, it may be dropped without being awaited."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, T]:
        return self.value
        yield  # a generator, so that ``await`` accepts it

    def __repr__(self) -> str:
        return f"<Ready: {self.value!r}>"
