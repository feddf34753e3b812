"""The actors living on one worker, and the calls they take on its data port.

An actor is the object its task built (``Client.submit(Cls, actor=True)``). The
task's result, what clients and other tasks get, is a handle naming this worker and
the key; the object itself stays here until the scheduler says its key is forgotten
(``drop``), or the worker loses its scheduler (``clear``).

Calls arrive as ``ActorCall`` messages on the data port, not through the scheduler:
a call is one round trip between caller and worker. Each actor runs its calls on a
thread of its own, one at a time and in the order they arrived, so its methods need
no locks; a slow method holds up its own actor only. ``async def`` methods run on
the worker's event loop instead, as Dask runs them. On that thread the method sees
the task's context: ``get_worker()``, ``get_client()``, and ``task_resources()``
with what the actor holds (its resources stay held while it lives).

An actor's method that calls another actor of this same worker does not send a
message: it runs that call at once on its own thread (``LocalActor.run``, used by
``client/actors.py``), as Dask does. A round trip would have the caller's thread
wait on a thread of the same worker, which deadlocks when the callee calls back,
or when the caller calls itself; and a short ``result(timeout=...)`` would expire
on the round trip alone. Each actor's lock (reentrant) keeps "one call at a time"
true across both paths: a call made here waits for the call the callee's own
thread is running, and a call back into the caller, on the same thread, goes in;
two actors calling each other at once from their own threads get an error rather
than wait on each other forever (``_Turns``).
An ``async def`` method, on the loop, must not wait so: its calls of another
actor's plain methods go to that actor's thread (``LocalActor.submit``), still
without a message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from apportion.core.allocation import Allocation
from apportion.core.payload import dumps, unpack_call
from apportion.protocol.peer_data import ActorCall, ActorReply
from apportion.worker.context import LocalActor, TaskWorker, awaiting_actor, running_actor
from apportion.worker.execution import pack_exception

if TYPE_CHECKING:
    from apportion.net.connection import Connection

logger = logging.getLogger("apportion.worker")


class _Turns:
    """Which thread runs a call of which actor of one worker, and which actor each
    thread waits to call: a direct call that would close a cycle (two actors calling
    each other at once, each from its own thread) is refused, saying so, rather
    than left waiting forever. Dask, whose actors share one thread, cannot meet
    this; here each actor has a thread, so two can run at once."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        #: Thread ident -> the actor that thread waits to call.
        self._waiting: dict[int, _Hosted] = {}

    @contextlib.contextmanager
    def taken(self, hosted: _Hosted) -> Iterator[None]:
        """Within this block, this thread runs a call of ``hosted``: once any call of it
        on another thread has ended (at once when this thread runs one already)."""
        me = threading.get_ident()
        if not hosted.lock.acquire(blocking=False):
            with self._mutex:
                self._refuse_cycle(hosted, me)
                self._waiting[me] = hosted
            try:
                hosted.lock.acquire()
            finally:
                with self._mutex:
                    del self._waiting[me]
        with self._mutex:
            hosted.owner = me
            hosted.depth += 1
        try:
            yield
        finally:
            with self._mutex:
                hosted.depth -= 1
                if not hosted.depth:
                    hosted.owner = None
            hosted.lock.release()

    def _refuse_cycle(self, wanted: _Hosted, me: int) -> None:
        chain = [wanted]
        owner = wanted.owner
        while owner is not None and owner != me:
            waited = self._waiting.get(owner)
            if waited is None or waited in chain:  # a free end, or others' own cycle
                return
            chain.append(waited)
            owner = waited.owner
        if owner == me:
            names = " -> ".join(h.key for h in chain)
            raise RuntimeError(
                f"actor {wanted.key!r} cannot take this call: it waits, through {names}, "
                "for the call making it; actors of one worker calling each other at once "
                "would wait forever"
            )


class _Hosted:
    """One actor: the object, what its task holds, and the thread its calls run on."""

    __slots__ = (
        "allocation",
        "depth",
        "dropped",
        "instance",
        "key",
        "lock",
        "owner",
        "thread",
        "turns",
        "worker",
    )

    def __init__(
        self, worker: TaskWorker, turns: _Turns, instance: Any, allocation: Allocation, key: str
    ) -> None:
        self.worker = worker
        self.turns = turns
        self.key = key
        self.instance = instance
        self.allocation = allocation
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"apportion-actor-{key}"[:60])
        #: Held by whichever thread runs one of its (non-async) calls: its own thread,
        #: or the thread of another actor of this worker calling it directly.
        #: Reentrant, so that a call back into an actor up the same thread's stack
        #: runs instead of waiting on itself.
        self.lock = threading.RLock()
        #: The thread holding ``lock`` and how many times (``turns`` updates both).
        self.owner: int | None = None
        self.depth = 0
        #: Released: calls still waiting for its thread are refused.
        self.dropped = False

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)`` on this thread, as one call of this actor: after
        any call of it under way, seeing its worker and what it holds."""
        with self.turns.taken(self), running_actor(self.worker, self.key, self.allocation):
            return func(*args, **kwargs)

    def submit(
        self, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """``func(*args, **kwargs)`` as one call of this actor, on its own thread."""
        try:
            return self.thread.submit(self.run, func, *args, **kwargs)
        except RuntimeError as exc:  # its thread was shut down
            raise LookupError(f"actor {self.key!r} was released") from exc


class ActorHost:
    """The actors of ``worker``, by key."""

    def __init__(self, worker: TaskWorker) -> None:
        self._worker = worker
        self._actors: dict[str, _Hosted] = {}
        self._turns = _Turns()
        self._calls: set[asyncio.Task[None]] = set()

    def __contains__(self, key: object) -> bool:
        return key in self._actors

    def __len__(self) -> int:
        return len(self._actors)

    def host(self, key: str, instance: Any, allocation: Allocation) -> None:
        """From the task's thread: ``instance`` is the actor of ``key`` from now on."""
        self._actors[key] = _Hosted(self._worker, self._turns, instance, allocation, key)

    def local(self, key: str) -> LocalActor | None:
        """The actor of ``key`` if this worker still holds it, for a call made directly
        by another of its actors (``client/actors.py``); None once it was dropped."""
        return self._actors.get(key)

    def drop(self, key: str) -> None:
        """The scheduler forgot ``key``: the actor goes (calls under way finish)."""
        hosted = self._actors.pop(key, None)
        if hosted is not None:
            hosted.dropped = True
            hosted.thread.shutdown(wait=False)

    def clear(self) -> None:
        """Every actor goes: the worker lost its scheduler, or is closing."""
        for key in list(self._actors):
            self.drop(key)

    async def close(self) -> None:
        self.clear()
        for call in list(self._calls):
            call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._calls, return_exceptions=True)

    def serve(self, message: ActorCall, conn: Connection) -> None:
        """On the loop: answer ``message`` on ``conn`` once the call returns, without
        holding up the other requests on that connection."""
        task = asyncio.create_task(self._answer(message, conn))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, message: ActorCall, conn: Connection) -> None:
        try:
            value = dumps(await self._call(message))
        except Exception as exc:
            exception, traceback = pack_exception(exc)
            reply = ActorReply(message.request_id, b"", exception, traceback)
        else:
            reply = ActorReply(message.request_id, value, b"", b"")
        if not conn.closed:
            conn.send(reply)

    async def _call(self, message: ActorCall) -> Any:
        hosted = self._actors.get(message.key)
        if hosted is None:
            raise LookupError(
                f"no actor {message.key!r} on worker {self._worker.name}: it was released, "
                "or its worker restarted"
            )
        if message.attribute:
            return await self._on_thread(
                hosted, message.key, getattr, hosted.instance, message.name
            )
        method = getattr(hosted.instance, message.name)
        args, kwargs = unpack_call(message.args, {})
        if inspect.iscoroutinefunction(method):
            with awaiting_actor(self._worker, message.key, hosted.allocation):
                return await method(*args, **kwargs)
        return await self._on_thread(hosted, message.key, method, *args, **kwargs)

    async def _on_thread(
        self, hosted: _Hosted, key: str, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """``func(*args, **kwargs)`` on the actor's thread, in the actor's context."""

        try:
            return await asyncio.get_running_loop().run_in_executor(
                hosted.thread, lambda: hosted.run(func, *args, **kwargs)
            )
        except RuntimeError as exc:  # its thread was shut down: the actor was dropped
            if hosted.dropped:
                raise LookupError(f"actor {key!r} was released while the call waited") from exc
            raise
