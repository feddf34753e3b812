"""``Lock``, ``Semaphore``, ``MultiLock`` and ``Event``, with Dask's names and semantics.

Leases are granted by the scheduler, first come first served (``scheduler/leases.py``).
A lease ends when released, when the client holding it disconnects (a crash, a
worker killed), or when it has not been refreshed for its *lease timeout*: the
client that holds it refreshes its leases from its own event loop every fifth of
that time, so a lease outlives a busy task but not a frozen or unreachable process.
The lease timeout is, first found: the ``lease_timeout=`` given, the
``APPORTION_LEASE_TIMEOUT`` environment variable, Dask's
``distributed.scheduler.locks.lease-timeout`` (if this program imported Dask), and
30 seconds; ``"inf"`` for none. It travels with the object when it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sys
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Self

from apportion.client.coordination import Named, bind, request, wire_timeout
from apportion.core.durations import Duration, seconds
from apportion.protocol.coordination import (
    CoordinationReply,
    EventRequest,
    LeaseRequest,
    RefreshLeases,
)

if TYPE_CHECKING:
    from apportion.client.client import Client

logger = logging.getLogger("apportion.client")

#: Environment variable giving the lease timeout of leases taken in this process.
LEASE_TIMEOUT_VARIABLE = "APPORTION_LEASE_TIMEOUT"
#: Dask's setting for the same.
DASK_LEASE_TIMEOUT = "distributed.scheduler.locks.lease-timeout"
DEFAULT_LEASE_TIMEOUT = 30.0


def lease_timeout(given: Duration | None = None) -> float:
    """The lease timeout in seconds (0: none), from the first place that gives one."""
    if given is not None:
        return _lease_seconds(given, "lease_timeout")
    text = os.environ.get(LEASE_TIMEOUT_VARIABLE)
    if text:
        return _lease_seconds(text, LEASE_TIMEOUT_VARIABLE)
    dask = sys.modules.get("dask")
    if dask is not None:
        value = dask.config.get(DASK_LEASE_TIMEOUT, None)
        if value is not None:
            return _lease_seconds(value, DASK_LEASE_TIMEOUT)
    return DEFAULT_LEASE_TIMEOUT


def _lease_seconds(value: Any, what: str) -> float:
    if value in ("inf", math.inf):
        return 0.0
    limit = seconds(value, what)
    if not limit:
        raise ValueError(f"{what}={value!r}: a lease timeout must be more than 0 ('inf': none)")
    return limit


class _LeaseKeeper:
    """Refreshes the leases one client holds, on its event loop, every fifth of the
    shortest lease timeout among them."""

    def __init__(self, client: Client) -> None:
        self._client = weakref.ref(client)
        self._loop = client._session.loop.loop
        #: lease id -> its lease timeout (0: never expires, not refreshed).
        self._leases: dict[str, float] = {}
        self._lock = threading.Lock()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, lease_id: str, timeout: float) -> None:
        with self._lock:
            self._leases[lease_id] = timeout
        if timeout > 0:
            with contextlib.suppress(RuntimeError):  # the loop stopped: the client closed
                self._loop.call_soon_threadsafe(self._arm)

    def remove(self, lease_id: str) -> None:
        with self._lock:
            self._leases.pop(lease_id, None)

    def _arm(self) -> None:
        """On the loop: refresh after a fifth of the shortest lease timeout, unless due."""
        with self._lock:
            timeouts = [t for t in self._leases.values() if t > 0]
        if self._timer is None and timeouts:
            self._timer = self._loop.call_later(min(timeouts) / 5, self._refresh)

    def _refresh(self) -> None:
        self._timer = None
        client = self._client()
        if client is None or client._closed or not client._session.connected:
            return  # its leases ended with its connection
        with self._lock:
            ids = [lease_id for lease_id, t in self._leases.items() if t > 0]
        if ids:
            client._session.post(RefreshLeases(ids))
            self._arm()


_keepers: weakref.WeakKeyDictionary[Client, _LeaseKeeper] = weakref.WeakKeyDictionary()
_keepers_lock = threading.Lock()


def _keeper(client: Client) -> _LeaseKeeper:
    with _keepers_lock:
        keeper = _keepers.get(client)
        if keeper is None:
            keeper = _keepers[client] = _LeaseKeeper(client)
        return keeper


class _Leases:
    """Leases on names of one kind, taken and given back by one object."""

    _kind = "semaphore"

    def __init__(
        self, names: list[str], max_leases: int, client: Client | None, timeout: Duration | None
    ) -> None:
        self._names = names
        self._max_leases = max_leases
        self._client = client
        #: As given, so that it travels with the object (``__reduce__``).
        self._lease_timeout_given = timeout
        self._lease_timeout = lease_timeout(timeout)
        #: Lease ids this object holds, oldest first (Dask releases the oldest first).
        self._leases: deque[str] = deque()

    @property
    def client(self) -> Client:
        """The client this object uses (bound on first use: see ``coordination.bind``)."""
        if self._client is None:
            self._client = bind(None)
        return self._client

    def _acquire(self, timeout: Duration | None, count: int) -> Any:
        lease_id = uuid.uuid4().hex
        limit = wire_timeout(timeout)
        client = self.client

        def granted(reply: CoordinationReply) -> bool:
            if reply.error:
                raise ValueError(reply.error)
            if reply.ok:
                self._leases.append(lease_id)
                _keeper(client).add(lease_id, self._lease_timeout)
            return bool(reply.ok)

        make = partial(
            LeaseRequest,
            op="acquire",
            kind=self._kind,
            names=self._names,
            lease_id=lease_id,
            count=count,
            max_leases=self._max_leases,
            timeout=limit,
            lease_timeout=self._lease_timeout,
        )
        return request(client, make, granted)

    def _release(self) -> Any:
        lease_id = self._leases.popleft()
        _keeper(self.client).remove(lease_id)

        def released(reply: CoordinationReply) -> bool:
            if reply.error:
                # Its lease expired (the scheduler warned then): others may hold it now.
                logger.warning("releasing %s: %s", self._names, reply.error)
            return bool(reply.ok)

        make = partial(
            LeaseRequest,
            op="release",
            kind=self._kind,
            names=self._names,
            lease_id=lease_id,
            count=0,
            max_leases=self._max_leases,
            timeout=0.0,
            lease_timeout=0.0,
        )
        return request(self.client, make, released)

    def _value(self, then: Callable[[int], Any] = int) -> Any:
        make = partial(
            LeaseRequest,
            op="value",
            kind=self._kind,
            names=self._names,
            lease_id="",
            count=0,
            max_leases=0,
            timeout=0.0,
            lease_timeout=0.0,
        )
        return request(self.client, make, lambda reply: then(int(reply.value)))

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # each kind has its own, with Dask's signature

    def release(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> Self:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class Semaphore(_Leases):
    """At most ``max_leases`` holders at once, across every client and task of the
    cluster, as Dask's ``Semaphore``: ``with sem:`` around access to a database that
    takes ten connections. Waiters are served first come first served.

    A lease is given back on ``release``, when its client disconnects, or when it has
    not been refreshed for its lease timeout (see the module's docstring).
    """

    def __init__(
        self,
        max_leases: int = 1,
        name: str | None = None,
        *,
        client: Client | None = None,
        lease_timeout: Duration | None = None,
    ) -> None:
        if isinstance(max_leases, bool) or not isinstance(max_leases, int):
            raise TypeError(f"max_leases must be an int, not {type(max_leases).__name__}")
        if max_leases < 1:
            raise ValueError(f"max_leases must be at least 1, not {max_leases}")
        #: The name every client uses to share this semaphore.
        self.name = name or f"semaphore-{uuid.uuid4().hex}"
        self.max_leases = max_leases
        super().__init__([self.name], max_leases, client, lease_timeout)

    def acquire(self, timeout: Duration | None = None) -> Any:
        """Take a lease, waiting up to ``timeout`` (None: as long as it takes); whether
        one was taken."""
        return self._acquire(timeout, 1)

    def release(self) -> Any:
        """Give back the oldest lease this object holds; ``RuntimeError`` if it holds
        none. False (with a warning) if that lease had expired already."""
        if not self._leases:
            raise RuntimeError("Released too often")
        return self._release()

    def get_value(self) -> Any:
        """How many leases are held now, by anyone."""
        return self._value()

    def close(self) -> Any:
        """Give back the leases this object holds (an awaitable that does, for an
        asynchronous client). The scheduler forgets a semaphore nobody holds or
        waits for by itself."""
        outcomes = [self._release() for _ in range(len(self._leases))]
        if self.client.asynchronous:
            return _all_of(outcomes)
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        return _semaphore, (self.max_leases, self.name, self._lease_timeout_given)

    def __repr__(self) -> str:
        return f"<Semaphore: {self.name}, max_leases={self.max_leases}>"


async def _all_of(awaitables: list[Any]) -> None:
    for awaitable in awaitables:
        await awaitable


def _semaphore(max_leases: int, name: str, timeout: Duration | None) -> Semaphore:
    return Semaphore(max_leases, name, lease_timeout=timeout)


class Lock(_Leases):
    """A lock shared by every client and task of the cluster, as Dask's ``Lock``: a
    semaphore with one lease (the same name is the same lock everywhere).

    Held by a client that disconnects, or not refreshed for its lease timeout, it is
    released (see the module's docstring).
    """

    def __init__(
        self,
        name: str | None = None,
        client: Client | None = None,
        *,
        lease_timeout: Duration | None = None,
    ) -> None:
        #: The name every client uses to share this lock.
        self.name = name or f"lock-{uuid.uuid4().hex}"
        super().__init__([self.name], 1, client, lease_timeout)

    def acquire(self, blocking: bool = True, timeout: Duration | None = None) -> Any:
        """Take the lock, waiting up to ``timeout`` (None: as long as it takes), or not at
        all unless ``blocking``; whether it was taken."""
        if not blocking:
            if timeout is not None:
                raise ValueError("can't specify a timeout for a non-blocking call")
            timeout = 0
        return self._acquire(timeout, 1)

    def release(self) -> Any:
        """Give the lock back; ``RuntimeError`` if this object does not hold it."""
        if not self._leases:
            raise RuntimeError("Released too often")
        return self._release()

    def locked(self) -> Any:
        """Whether anyone holds the lock now."""
        return self._value(lambda held: held == 1)

    def get_value(self) -> Any:
        """1 if anyone holds the lock now, else 0."""
        return self._value()

    def __reduce__(self) -> tuple[Any, ...]:
        return _lock, (self.name, self._lease_timeout_given)

    def __repr__(self) -> str:
        return f"<Lock: {self.name}>"


def _lock(name: str, timeout: Duration | None) -> Lock:
    return Lock(name, lease_timeout=timeout)


class MultiLock(_Leases):
    """Several locks taken together, all or none, as Dask's ``MultiLock`` (its names
    are apart from ``Lock``'s). Two multi-locks over overlapping names, in any order,
    never deadlock: nothing is held while waiting, and waiters are served first
    come first served on each name.
    """

    _kind = "multilock"

    def __init__(
        self,
        names: list[str] | None = None,
        client: Client | None = None,
        *,
        lease_timeout: Duration | None = None,
    ) -> None:
        #: The names of the locks taken together.
        self.names = list(names or [])
        super().__init__(self.names, 1, client, lease_timeout)

    def acquire(
        self, blocking: bool = True, timeout: Duration | None = None, num_locks: int | None = None
    ) -> Any:
        """Take ``num_locks`` of the locks (default: all) at once, waiting up to
        ``timeout`` (None: as long as it takes), or not at all unless ``blocking``;
        whether they were taken."""
        if not blocking:
            if timeout is not None:
                raise ValueError("can't specify a timeout for a non-blocking call")
            timeout = 0
        if not self.names:
            raise ValueError("a MultiLock needs at least one name to acquire")
        if self._leases:
            raise RuntimeError("this MultiLock is held already: release it first")
        return self._acquire(timeout, num_locks or len(self.names))

    def release(self) -> Any:
        """Give the locks back; ``ValueError`` if this object does not hold them."""
        if not self._leases:
            raise ValueError("Lock is not yet acquired")
        return self._release()

    def locked(self) -> bool:
        """Whether this object holds its locks."""
        return bool(self._leases)

    def __reduce__(self) -> tuple[Any, ...]:
        return _multilock, (self.names, self._lease_timeout_given)

    def __repr__(self) -> str:
        return f"<MultiLock: {self.names}>"


def _multilock(names: list[str], timeout: Duration | None) -> MultiLock:
    return MultiLock(names, lease_timeout=timeout)


class Event(Named):
    """A flag shared by every client and task of the cluster, as Dask's ``Event``:
    ``wait`` until some other one calls ``set``."""

    def __init__(self, name: str | None = None, client: Client | None = None) -> None:
        super().__init__(name or f"event-{uuid.uuid4().hex}", client)

    def _ask(self, op: str, timeout: float = 0.0) -> Any:
        def answered(reply: CoordinationReply) -> bool:
            if reply.error:
                raise RuntimeError(reply.error)
            return bool(reply.ok)

        return request(self.client, lambda rid: EventRequest(rid, op, self.name, timeout), answered)

    def wait(self, timeout: Duration | None = None) -> Any:
        """Wait until the event is set, up to ``timeout`` (None: as long as it takes);
        whether it is set."""
        return self._ask("wait", wire_timeout(timeout))

    def set(self) -> Any:
        """Set the event: every waiter wakes, and waits return at once until ``clear``."""
        return self._ask("set")

    def clear(self) -> Any:
        """Clear the event: waits wait again."""
        return self._ask("clear")

    def is_set(self) -> Any:
        """Whether the event is set now."""
        return self._ask("is_set")

    def __reduce__(self) -> tuple[Any, ...]:
        return Event, (self.name,)

    def __repr__(self) -> str:
        return f"<Event: {self.name}>"
