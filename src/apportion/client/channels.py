"""``Variable``, ``Queue``, ``Pub`` and ``Sub``, with Dask's names and semantics.

A value may be any picklable object; futures in it keep their results alive in
the cluster while the value is in the variable or the queue, whoever put it there
and whether or not that client stays, and come out as futures of the client that
gets them. Values pass through the scheduler: share large data as futures
(``client.scatter``), not as values. Pub/Sub messages are routed through the
scheduler too, to the clients subscribed when they are published.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from apportion.client import topics
from apportion.client.asynchronous import Ready
from apportion.client.coordination import Named, pack, post, request, unpack, wire_timeout
from apportion.core.durations import Duration, seconds
from apportion.core.payload import Pickled
from apportion.protocol.coordination import (
    Publish,
    Subscribe,
    Unsubscribe,
    ValueReply,
    ValueRequest,
)

if TYPE_CHECKING:
    from apportion.client.client import Client


def _nothing(reply: ValueReply) -> None:
    return None


def _ask(
    shared: Named,
    kind: str,
    op: str,
    *,
    items: list[Pickled] | None = None,
    keys: list[str] | None = None,
    count: int = 0,
    maxsize: int = 0,
    timeout: float = 0.0,
    then: Callable[[ValueReply], Any] = _nothing,
    keep: object = None,
) -> Any:
    """Send ``op`` on the variable or queue ``shared``; ``then(reply)`` unless the
    scheduler refused it (``ValueError``). See ``coordination.request``."""

    def answered(reply: ValueReply) -> Any:
        if reply.error:
            raise ValueError(reply.error)
        return then(reply)

    make = partial(
        ValueRequest,
        op=op,
        kind=kind,
        name=shared.name,
        items=items or [],
        keys=keys or [],
        count=count,
        maxsize=maxsize,
        timeout=timeout,
    )
    return request(shared.client, make, answered, keep)


class Variable(Named):
    """A value shared by every client and task of the cluster, as Dask's ``Variable``:
    one client or task ``set``s it, others ``get`` it (a flag to stop a long task,
    the latest model). A future set into it keeps its result in the cluster until
    the variable is set again or deleted."""

    def __init__(self, name: str | None = None, client: Client | None = None) -> None:
        super().__init__(name or f"variable-{uuid.uuid4().hex}", client)

    def set(self, value: Any, timeout: Duration | None = "30 s") -> Any:
        """Set the value. ``timeout`` is Dask's wait for a future's task to reach the
        scheduler; here it is there already, so nothing waits for it."""
        seconds(timeout)  # a malformed one is still an error
        blob, keys = pack(value)
        return _ask(self, "variable", "set", items=[blob], keys=keys, keep=value)

    def get(self, timeout: Duration | None = None) -> Any:
        """The value, once set: wait up to ``timeout`` (None: as long as it takes) for
        it to be set, then ``TimeoutError``."""
        client = self.client

        def value(reply: ValueReply) -> Any:
            if reply.timed_out:
                raise TimeoutError(f"variable {self.name!r} was not set within {timeout}")
            return unpack(client, reply.items, reply.keys)[0]

        return _ask(self, "variable", "get", timeout=wire_timeout(timeout), then=value)

    def delete(self) -> Any:
        """Forget the value, for every client (its futures' results may go); gets wait
        for it to be set again."""
        return _ask(self, "variable", "delete")

    def __reduce__(self) -> tuple[Any, ...]:
        return Variable, (self.name,)

    def __repr__(self) -> str:
        return f"<Variable: {self.name}>"


class Queue(Named):
    """A first-in first-out queue shared by every client and task of the cluster, as
    Dask's ``Queue``. ``maxsize`` bounds it (0: no bound): ``put`` waits while it is
    full, ``get`` while it is empty. Futures put in it keep their results in the
    cluster until taken out."""

    def __init__(self, name: str | None = None, client: Client | None = None, maxsize: int = 0):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"maxsize must be an int of 0 (no bound) or more, not {maxsize!r}")
        super().__init__(name or f"queue-{uuid.uuid4().hex}", client)
        self.maxsize = maxsize

    def put(self, value: Any, timeout: Duration | None = None) -> Any:
        """Put ``value`` at the end, waiting up to ``timeout`` (None: as long as it takes)
        for room, then ``TimeoutError`` (and the value is not put)."""
        blob, keys = pack(value)

        def put(reply: ValueReply) -> None:
            if reply.timed_out:
                raise TimeoutError(f"queue {self.name!r} stayed full for {timeout}")

        return _ask(
            self,
            "queue",
            "put",
            items=[blob],
            keys=keys,
            count=1,
            maxsize=self.maxsize,
            timeout=wire_timeout(timeout),
            then=put,
            keep=value,
        )

    def get(self, timeout: Duration | None = None, batch: bool | int = False) -> Any:
        """The next value, waiting up to ``timeout`` (None: as long as it takes), then
        ``TimeoutError``. ``batch=True``: a list of every value there now (no waiting);
        ``batch=n``: a list of the next ``n``, taken together once there are ``n``."""
        if batch is True:
            count = 0
        elif batch is False:
            count = 1
        elif isinstance(batch, int) and batch >= 0:
            if batch == 0:
                return Ready([]) if self.client.asynchronous else []
            count = batch
        else:
            raise ValueError(f"batch must be True, False or a count, not {batch!r}")
        client = self.client

        def taken(reply: ValueReply) -> Any:
            if reply.timed_out:
                raise TimeoutError(f"queue {self.name!r} had too few items for {timeout}")
            values = unpack(client, reply.items, reply.keys)
            return values if batch is not False else values[0]

        return _ask(
            self,
            "queue",
            "get",
            count=count,
            maxsize=self.maxsize,
            timeout=wire_timeout(timeout),
            then=taken,
        )

    def qsize(self) -> Any:
        """How many values are in the queue now."""
        return _ask(self, "queue", "size", maxsize=self.maxsize, then=lambda r: int(r.size))

    def close(self) -> None:
        """Nothing to do, kept for Dask's code: the scheduler forgets a queue by itself
        once it is empty and nobody waits on it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return Queue, (self.name, None, self.maxsize)

    def __repr__(self) -> str:
        return f"<Queue: {self.name}, maxsize={self.maxsize}>"


class Pub(Named):
    """Publish messages on a topic, as Dask's ``Pub`` (which Dask 2026 no longer has):
    every ``Sub`` of that name subscribed when a message is published gets it. Routed
    through the scheduler; messages are pickled objects, not futures."""

    def __init__(self, name: str | None = None, client: Client | None = None) -> None:
        super().__init__(name or f"topic-{uuid.uuid4().hex}", client)

    def put(self, msg: Any) -> None:
        """Publish ``msg`` (without waiting for it to arrive)."""
        blob, keys = pack(msg)
        if keys:
            raise TypeError(
                "futures cannot be published: put them in a Queue or a Variable, "
                "which keep their results in the cluster"
            )
        post(self.client, Publish(self.name, blob))

    def __reduce__(self) -> tuple[Any, ...]:
        return Pub, (self.name,)

    def __repr__(self) -> str:
        return f"<Pub: {self.name}>"


class Sub(Named):
    """Receive what is published on a topic from now on, as Dask's ``Sub``: ``get``
    the next message, or iterate. Messages wait in ``buffer`` until taken."""

    def __init__(self, name: str | None = None, client: Client | None = None) -> None:
        super().__init__(name or f"topic-{uuid.uuid4().hex}", client)
        #: Messages received and not taken yet, oldest first, still pickled: ``get``
        #: unpickles each on the thread that takes it (``topics.deliver``).
        self.buffer: deque[Pickled] = deque()
        self._arrived = threading.Condition()
        client = self.client  # bound now: messages must have somewhere to arrive
        topics.add(client, self.name, self)
        request(client, lambda rid: Subscribe(rid, self.name))
        weakref.finalize(self, _unsubscribe, weakref.ref(client), self.name)

    def receive(self, blob: Pickled) -> None:
        """On the client's loop: a message arrived."""
        with self._arrived:
            self.buffer.append(blob)
            self._arrived.notify_all()

    def get(self, timeout: Duration | None = None) -> Any:
        """The next message, waiting up to ``timeout`` (None: as long as it takes), then
        ``TimeoutError``."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: self.buffer, seconds(timeout)):
                raise TimeoutError(f"nothing was published on {self.name!r} for {timeout}")
            blob = self.buffer.popleft()
        return topics.opened(self.name, blob)

    def __iter__(self) -> Sub:
        return self

    def __next__(self) -> Any:
        return self.get()

    def __reduce__(self) -> tuple[Any, ...]:
        return Sub, (self.name,)

    def __repr__(self) -> str:
        return f"<Sub: {self.name}>"


def _unsubscribe(client_ref: weakref.ref[Client], name: str) -> None:
    """A ``Sub`` was dropped: its subscription ends (nothing to do if its client closed)."""
    client = client_ref()
    if client is not None and not client._closed:
        with contextlib.suppress(Exception):  # disconnected meanwhile: nothing to end
            post(client, Unsubscribe(name))
