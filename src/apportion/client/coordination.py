"""What the coordination primitives share: which client they use, the one way their
requests travel, how values with futures in them are packed, and ``fire_and_forget``.

Locks, semaphores, multi-locks and events are in ``locks.py``; variables, queues,
and Pub/Sub in ``channels.py``. Their state lives in the scheduler
(``scheduler/coordination.py``); these objects are only names and handles, so they
pickle as their names and, unpickled in a task, use the task's worker's client.

Every request goes through ``request``: a request that waits (an acquire, a get, a
wait) carries its own timeout, and the scheduler answers at the latest at its
deadline, so the client waits for that answer however long it takes and never
gives up on its own (a grant could otherwise cross a client that stopped waiting).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apportion.client.future import Future
from apportion.client.task_client import get_client
from apportion.client.waiting import futures_of
from apportion.core import payload
from apportion.core.durations import Duration, seconds
from apportion.core.payload import Pickled
from apportion.protocol.base import Message
from apportion.protocol.coordination import NO_TIMEOUT
from apportion.protocol.tasks import FireAndForget, SubmitTasks

if TYPE_CHECKING:
    from apportion.client.client import Client


def bind(client: Client | None) -> Client:
    """``client`` if given, else ``get_client()``: in a task, its worker's client;
    elsewhere the default client (``ValueError`` if none is open)."""
    return client if client is not None else get_client()


class Named:
    """A shared object known by its name, bound to a client on first use."""

    def __init__(self, name: str, client: Client | None) -> None:
        #: The name every client uses to share this object.
        self.name = name
        self._client = client

    @property
    def client(self) -> Client:
        """The client this object uses (bound on first use: see ``bind``)."""
        if self._client is None:
            self._client = bind(None)
        return self._client


def request(
    client: Client,
    make: Callable[[int], Message],
    then: Callable[[Any], Any] = lambda r: r,
    keep: object = None,
) -> Any:
    """Send the request ``make(request_id)`` builds; ``then(answer)`` — or, from the
    event loop of an asynchronous client, an awaitable of it (as Dask's primitives
    are awaited there: ``await lock.acquire()``).

    ``keep`` (the futures in a value sent) stays referenced until the answer: an
    awaitable is sent only when awaited, and a future dropped before that would
    release its key ahead of the request that shares it.
    """
    client._link.check_open()
    if keep is None:
        return client._link.ask(make, then)

    def answered(reply: Any) -> Any:
        nonlocal keep
        keep = None  # answered: the request no longer needs them
        return then(reply)

    return client._link.ask(make, answered)


def post(client: Client, message: Message) -> None:
    """Send a message that has no answer, in order with everything the client sends."""
    client._link.check_open()
    client._session.post(message)


def wire_timeout(timeout: Duration | None) -> float:
    """A timeout as the wire carries it: seconds, or ``NO_TIMEOUT`` for none."""
    limit = seconds(timeout)
    return NO_TIMEOUT if limit is None else limit


def pack(value: Any) -> tuple[Pickled, list[str]]:
    """``value`` pickled, with the keys of the futures in it (they travel as references)."""
    blob, keys = payload.pack_call((value,), {})
    return blob, sorted(keys)


def unpack(client: Client, items: list[Pickled], keys: list[str]) -> list[Any]:
    """Values from the scheduler, their futures now futures of ``client``.

    The scheduler made ``client`` want ``keys`` when it answered; the futures are
    made before unpickling, so that whatever happens next, dropping them lets the
    keys go again. Asking for the keys once more then brings their states (done,
    failed), which may have arrived before the futures existed to hear them.
    """
    futures = {key: Future(key, client) for key in keys}
    values = [payload.unpack_call(item, futures)[0][0] for item in items]
    if futures:
        post(client, SubmitTasks([], {}, sorted(futures)))
    return values


def fire_and_forget(obj: Any) -> None:
    """Run the tasks of these futures (a future, or any collection of them) to the end,
    even once no client holds a future for them any more (as Dask's
    ``fire_and_forget``): for tasks run for their effects, such as writing a file.
    Their results are dropped when they finish, unless someone still wants them."""
    keys_by_client: dict[int, tuple[Client, list[str]]] = {}
    for future in futures_of(obj):
        _, keys = keys_by_client.setdefault(id(future.client), (future.client, []))
        keys.append(future.key)
    for client, keys in keys_by_client.values():
        post(client, FireAndForget(keys))
