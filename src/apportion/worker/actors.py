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
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from apportion.core.allocation import Allocation
from apportion.core.payload import dumps, unpack_call
from apportion.protocol.peer_data import ActorCall, ActorReply
from apportion.worker.context import TaskWorker, running_actor
from apportion.worker.execution import pack_exception

if TYPE_CHECKING:
    from apportion.net.connection import Connection

logger = logging.getLogger("apportion.worker")


class _Hosted:
    """One actor: the object, what its task holds, and the thread its calls run on."""

    __slots__ = ("allocation", "dropped", "instance", "thread")

    def __init__(self, instance: Any, allocation: Allocation, key: str) -> None:
        self.instance = instance
        self.allocation = allocation
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"apportion-actor-{key}"[:60])
        #: Released: calls still waiting for its thread are refused.
        self.dropped = False


class ActorHost:
    """The actors of ``worker``, by key."""

    def __init__(self, worker: TaskWorker) -> None:
        self._worker = worker
        self._actors: dict[str, _Hosted] = {}
        self._calls: set[asyncio.Task[None]] = set()

    def __contains__(self, key: object) -> bool:
        return key in self._actors

    def __len__(self) -> int:
        return len(self._actors)

    def host(self, key: str, instance: Any, allocation: Allocation) -> None:
        """From the task's thread: ``instance`` is the actor of ``key`` from now on."""
        self._actors[key] = _Hosted(instance, allocation, key)

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
            return await method(*args, **kwargs)
        return await self._on_thread(hosted, message.key, method, *args, **kwargs)

    async def _on_thread(
        self, hosted: _Hosted, key: str, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """``func(*args, **kwargs)`` on the actor's thread, in the actor's context."""

        def run() -> Any:
            with running_actor(self._worker, key, hosted.allocation):
                return func(*args, **kwargs)

        try:
            return await asyncio.get_running_loop().run_in_executor(hosted.thread, run)
        except RuntimeError as exc:  # its thread was shut down: the actor was dropped
            if hosted.dropped:
                raise LookupError(f"actor {key!r} was released while the call waited") from exc
            raise
