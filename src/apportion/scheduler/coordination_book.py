"""What the scheduler keeps for coordinating clients and tasks: plain data.

Leases of semaphores and multi-locks (``leases.py``); variables, queues, events
and topics (``channels.py``); keys run to the end for nobody (``coordination.py``).
Defined here, beside the other books, so that the core owns them without
importing a handler.

Every request that waits is a ``Waiter`` with a deadline (``math.inf`` for none),
answered when it can be granted, or at its deadline on a ``Tick``, or dropped when
its client leaves: none is ever left without an answer.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from apportion.core.payload import Pickled

#: Kinds of lease: the two namespaces, as Dask's semaphores (and locks) and
#: multi-locks are two separate extensions.
SEMAPHORE = "semaphore"
MULTILOCK = "multilock"
LEASE_KINDS = (SEMAPHORE, MULTILOCK)

#: Pseudo-client that wants the keys given to ``fire_and_forget`` until they finish.
FIRE_AND_FORGET = "fire-and-forget"
#: Prefixes of the pseudo-clients that keep the futures in a variable or a queue.
VARIABLE_OWNER = "variable:"
QUEUE_OWNER = "queue:"


@dataclass(slots=True, eq=False)
class Waiter:
    """A client's request waiting for its answer (compared by identity: queues
    remove this very one)."""

    client_id: str
    request_id: int
    #: When it is answered "timed out" (scheduler time); ``math.inf``: never.
    deadline: float


@dataclass(slots=True, eq=False)
class LeaseWaiter(Waiter):
    """An acquire waiting in the queue of each of its names, in arrival order."""

    lease_id: str = ""
    names: tuple[str, ...] = ()
    #: How many of ``names`` it needs at once.
    count: int = 1
    lease_timeout: float = 0.0


@dataclass(slots=True)
class Lease:
    """Names held by one client's acquire, until released, expired or the client leaves."""

    lease_id: str
    kind: str
    client_id: str
    names: tuple[str, ...]
    #: Seconds it lasts without a refresh (0: until released or its client leaves).
    lease_timeout: float
    #: When its holder last said it is alive (scheduler time).
    refreshed: float

    @property
    def expires(self) -> float:
        return self.refreshed + self.lease_timeout if self.lease_timeout > 0 else math.inf


@dataclass(slots=True)
class LeasePool:
    """One named semaphore or lock: its leases and, first come first served, its waiters.

    A waiter is granted only at the head of the queue of every name it asks for, so
    a later request never overtakes an earlier one on a shared name, and nothing is
    held while waiting: two multi-locks taking the same names in any order cannot
    deadlock. Dropped from the book once nothing holds or waits.
    """

    max_leases: int
    #: lease id -> the lease; never more than ``max_leases``.
    holders: dict[str, Lease] = field(default_factory=dict)
    queue: deque[LeaseWaiter] = field(default_factory=deque)

    @property
    def free(self) -> int:
        return self.max_leases - len(self.holders)


@dataclass(slots=True)
class VariableRecord:
    """A shared variable's value; the keys it refers to are wanted by its pseudo-client."""

    data: Pickled
    keys: list[str]


@dataclass(slots=True, eq=False)
class QueueGetter(Waiter):
    """A get waiting for ``count`` items (taken all at once)."""

    count: int = 1


@dataclass(slots=True, eq=False)
class QueuePutter(Waiter):
    """A put waiting for room; its keys are wanted by the queue already."""

    data: Pickled = b""
    keys: list[str] = field(default_factory=list)


@dataclass(slots=True)
class QueueRecord:
    """A shared queue: items in order, and the gets and puts waiting, first come first
    served. Dropped from the book once empty with nobody waiting."""

    maxsize: int
    items: deque[tuple[Pickled, list[str]]] = field(default_factory=deque)
    getters: deque[QueueGetter] = field(default_factory=deque)
    putters: deque[QueuePutter] = field(default_factory=deque)
    #: key -> items (held and waiting to go in) referring to it; the queue's
    #: pseudo-client wants exactly these keys.
    key_counts: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class EventRecord:
    """A shared event; dropped from the book while clear with nobody waiting (as Dask's)."""

    is_set: bool = False
    waiters: list[Waiter] = field(default_factory=list)


@dataclass
class CoordinationBook:
    """Every lock, semaphore, variable, queue, event and topic of the cluster."""

    #: kind (``SEMAPHORE``, ``MULTILOCK``) -> name -> pool.
    pools: dict[str, dict[str, LeasePool]] = field(
        default_factory=lambda: {kind: {} for kind in LEASE_KINDS}
    )
    #: lease id -> lease, of every kind.
    leases: dict[str, Lease] = field(default_factory=dict)
    variables: dict[str, VariableRecord] = field(default_factory=dict)
    #: name -> gets waiting for the variable to be set.
    variable_waiters: dict[str, list[Waiter]] = field(default_factory=dict)
    queues: dict[str, QueueRecord] = field(default_factory=dict)
    events: dict[str, EventRecord] = field(default_factory=dict)
    #: topic -> client id -> its subscriptions (a client gets one copy of each message).
    topics: dict[str, Counter[str]] = field(default_factory=dict)
    #: Ids of the pseudo-clients of this book (variables, queues, fire-and-forget):
    #: notices addressed to them are read here, never sent.
    owners: set[str] = field(default_factory=set)
    #: Pseudo-clients of this book dropped during the event being handled: notices
    #: addressed to them before they went are dropped too.
    gone_owners: set[str] = field(default_factory=set)
    #: No deadline or lease expiry comes before this time: a ``Tick`` earlier than
    #: it has nothing to do here. A lower bound, tightened when something is added.
    next_due: float = math.inf

    def due(self, when: float) -> None:
        """Something must happen at ``when``: ticks must look from then on."""
        if when < self.next_due:
            self.next_due = when
