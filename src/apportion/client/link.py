"""How the client's parts reach the scheduler: one narrow interface, ``SchedulerLink``.

What the client does beyond tasks and futures (runs on workers, plugins, datasets,
cluster facts, restarts, the task stream) lives in modules of functions that take
a ``SchedulerLink`` and nothing else of the client: they ask, post and wait through
it, and cannot reach the client's keys or futures. ``ClientLink`` is the client's
own link, over its ``Session``.

Whether a call is asynchronous is decided where it is made, as Dask decides it: a
client made with ``asynchronous=True`` returns awaitables when called from a running
event loop, and blocks when called from a thread that has none (a done-callback,
``asyncio.to_thread``), where blocking harms nobody; any client returns awaitables
when called from its own loop (a coroutine run by ``client.sync``), where blocking
would stop the work it waits for. ``ask`` and ``run`` give the
outcome itself to a blocking caller and an awaitable of it to an asynchronous one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from apportion.client.asynchronous import Ready, awaited
from apportion.client.errors import SchedulerGoneError
from apportion.client.session import Session
from apportion.core.tracebacks import trimmed
from apportion.protocol.base import Message

T = TypeVar("T")


def _as_is(reply: Any) -> Any:
    return reply


async def _after(outcome: Awaitable[Any], then: Callable[[Any], Any]) -> Any:
    """``then(await outcome)``: ``then`` in the awaiting loop, not the client's; a task's
    failure it raises reaches the awaiting caller with the user's frames only."""
    value = await outcome
    try:
        return then(value)
    except Exception as exc:
        try:
            raise trimmed(exc)
        finally:
            del exc  # else this frame and the exception's traceback hold each other


class SchedulerLink(Protocol):
    """All a client's part may do with the scheduler."""

    @property
    def asynchronous(self) -> bool:
        """Calls return awaitables (made asynchronous, called from a running loop)."""
        ...

    @property
    def identity(self) -> dict[str, Any]:
        """The scheduler's identity and workers as last fetched (``scheduler_info``)."""
        ...

    def remember(self, identity: dict[str, Any]) -> None:
        """Keep ``identity``, freshly fetched, for ``identity``."""
        ...

    @property
    def address(self) -> str:
        """The scheduler's address ("" for a cluster that has not started yet)."""
        ...

    @property
    def status(self) -> str:
        """The client's own state in words: "connected", "closed", "not connected yet"
        (asynchronous, not awaited), "lost the scheduler"."""
        ...

    def check_open(self) -> None:
        """Raise if the client is closed or has lost the scheduler."""
        ...

    def ask(
        self,
        make: Callable[[int], Message],
        then: Callable[[Any], Any] = _as_is,
        timeout: float | None = None,
    ) -> Any:
        """Send the request ``make(request_id)``; ``then(reply)``, or an awaitable of it.

        ``then`` runs on the caller's thread (in its loop, awaited), never on the
        client's loop: what it unpickles may be of a module that thread is importing
        (``results.loads_here``)."""
        ...

    async def request(self, make: Callable[[int], Message]) -> Any:
        """On the client's loop: send the request ``make(request_id)``; its reply."""
        ...

    def run(
        self,
        func: Callable[..., Coroutine[Any, Any, Any]],
        *args: Any,
        timeout: float | None = None,
        asynchronous: bool | None = None,
        then: Callable[[Any], Any] = _as_is,
    ) -> Any:
        """``func(*args)`` run on the client's loop; ``then(outcome)`` run by the caller,
        or an awaitable of it."""
        ...

    def post(self, message: Message) -> None:
        """Send ``message`` with no reply to wait for, in order with everything else."""
        ...

    def ready(self, value: T) -> T | Ready[T]:
        """``value`` of work done at once: as it is, or (asynchronous) as an awaitable."""
        ...


class ClientLink:
    """A client's ``SchedulerLink``: its session (once connected), whether it is
    closed, and what it last heard of the scheduler's identity."""

    def __init__(self, address: str, asynchronous: bool) -> None:
        #: The scheduler's address ("" for a cluster that has not started yet).
        self.address = address
        #: Made with ``asynchronous=True``.
        self.wants_async = asynchronous
        #: None until connected (an asynchronous client connects when first awaited).
        self.session: Session | None = None
        self.closed = False
        self._identity: dict[str, Any] = {}

    @property
    def asynchronous(self) -> bool:
        """Dask's rule, in this client's shape: from a running loop, when the client
        was made asynchronous, or whatever it was made, when that loop is the
        client's own. A coroutine run there (``client.sync(coroutine_function)``)
        must await, since blocking would stop the very loop that does the work."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if self.wants_async:
            return True
        session = self.session
        return session is not None and running is session.loop.loop

    @property
    def identity(self) -> dict[str, Any]:
        return self._identity

    def remember(self, identity: dict[str, Any]) -> None:
        self._identity = identity

    @property
    def connected(self) -> Session:
        """The session; an error for an asynchronous client not awaited yet."""
        session = self.session
        if session is None:
            raise RuntimeError(
                "this asynchronous Client is not connected yet: await it first "
                "(client = await Client(..., asynchronous=True), or async with)"
            )
        return session

    @property
    def status(self) -> str:
        if self.closed:
            return "closed"
        if self.session is None:
            return "not connected yet"
        return "connected" if self.session.connected else "lost the scheduler"

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this client is closed")
        if not self.connected.connected:
            raise SchedulerGoneError(f"lost the connection to {self.address}")

    def ask(
        self,
        make: Callable[[int], Message],
        then: Callable[[Any], Any] = _as_is,
        timeout: float | None = None,
    ) -> Any:
        session = self.connected
        if not self.asynchronous:
            return then(session.call(make, timeout))

        async def asked() -> Any:
            return await session.request(make(session.next_id()))

        return _after(awaited(session.loop, asked, timeout=timeout), then)

    async def request(self, make: Callable[[int], Message]) -> Any:
        session = self.connected
        return await session.request(make(session.next_id()))

    def run(
        self,
        func: Callable[..., Coroutine[Any, Any, Any]],
        *args: Any,
        timeout: float | None = None,
        asynchronous: bool | None = None,
        then: Callable[[Any], Any] = _as_is,
    ) -> Any:
        if self.asynchronous if asynchronous is None else asynchronous:
            outcome = awaited(self.connected.loop, func, *args, timeout=timeout)
            return outcome if then is _as_is else _after(outcome, then)
        return then(self.connected.run(func(*args), timeout))

    def post(self, message: Message) -> None:
        self.connected.post(message)

    def ready(self, value: T) -> T | Ready[T]:
        return Ready(value) if self.asynchronous else value
