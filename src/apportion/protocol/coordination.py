"""Client <-> scheduler: locks, semaphores, events, variables, queues and topics.

The state of each lives in the scheduler (``scheduler/leases.py``,
``scheduler/channels.py``). A request that must wait (an acquire, a get, a wait)
carries its own ``timeout``: the scheduler answers when it can grant it, or says
"timed out" at the deadline, so a grant can never cross a client that gave up.
"""

from __future__ import annotations

from apportion.core.payload import Pickled
from apportion.protocol.base import Message, message

#: ``timeout`` of a request that waits as long as it takes.
NO_TIMEOUT = -1.0


@message(109)
class LeaseRequest(Message):
    """Client -> scheduler: an operation on leases of semaphores (``Lock`` is one with
    one lease) or of multi-locks (two separate namespaces, as in Dask).

    ``op``: "acquire" ``count`` of ``names`` at once (all or nothing) as ``lease_id``,
    waiting up to ``timeout`` seconds (0: not at all; ``NO_TIMEOUT``: without limit);
    "release" ``lease_id``; "value": the leases held on ``names[0]``.
    """

    request_id: int
    op: str
    kind: str  #: "semaphore" or "multilock"
    names: list[str]
    lease_id: str
    count: int  #: how many of ``names`` the lease needs (1 for a semaphore)
    max_leases: int  #: leases a semaphore grants at once (checked against its first user)
    timeout: float
    #: Seconds the lease lasts without a ``RefreshLeases`` (0: until released).
    lease_timeout: float


@message(110)
class RefreshLeases(Message):
    """Client -> scheduler: the holder of these leases is alive (no reply)."""

    lease_ids: list[str]


@message(111)
class EventRequest(Message):
    """Client -> scheduler: "set", "clear", "is_set" or "wait" (up to ``timeout``) on an event."""

    request_id: int
    op: str
    name: str
    timeout: float


@message(112)
class CoordinationReply(Message):
    """Scheduler -> client: the answer to a ``LeaseRequest``, ``EventRequest`` or
    ``Subscribe``. ``ok``: granted, released, set (1) or not (0, also a timeout);
    ``value``: leases held; ``error`` says why the request was refused ("" if not)."""

    request_id: int
    ok: int
    value: int
    error: str


@message(113)
class ValueRequest(Message):
    """Client -> scheduler: an operation on a shared variable or queue.

    Variables: "set" ``items[0]``, "get" (waiting up to ``timeout`` until one is set),
    "delete". Queues: "put" ``items[0]`` (waiting up to ``timeout`` while full), "get"
    ``count`` items (0: every item there now, without waiting), "size". ``maxsize``
    is the queue's bound (0: none), checked against the queue's first user. Futures
    inside an item pickle as references to ``keys``, which the scheduler keeps alive
    while the item is held.
    """

    request_id: int
    op: str
    kind: str  #: "variable" or "queue"
    name: str
    items: list[Pickled]
    keys: list[str]
    count: int
    maxsize: int
    timeout: float


@message(114)
class ValueReply(Message):
    """Scheduler -> client: the items asked for and the keys they refer to (which this
    client now wants), the queue's size, ``timed_out`` 1 at the deadline, or ``error``."""

    request_id: int
    items: list[Pickled]
    keys: list[str]
    size: int
    timed_out: int
    error: str


@message(115)
class Subscribe(Message):
    """Client -> scheduler: send me what is published on topic ``name`` from now on."""

    request_id: int
    name: str


@message(116)
class Unsubscribe(Message):
    """Client -> scheduler: one subscription of mine to ``name`` ended (no reply)."""

    name: str


@message(117)
class Publish(Message):
    """Client or worker -> scheduler: pass ``data`` (a pickled object) to every
    subscriber of ``name`` (a worker publishes what tasks ``print`` and ``warn``)."""

    name: str
    data: Pickled


@message(118)
class TopicMessage(Message):
    """Scheduler -> client: ``data`` was published on a topic this client subscribes to."""

    name: str
    data: Pickled
