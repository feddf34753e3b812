"""Requests in flight and what clients left with the scheduler: plain data.

The handler modules (``relay``, ``drain``, ``copies``, ``remote_calls``,
``shared_data``) decide what these books hold; the books are defined here, below
them and beside the records, so that the scheduler's core can own them without
importing any handler (handlers import the core, never the other way round).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apportion.core.payload import Pickled
from apportion.protocol.tasks import ScatterRequest
from apportion.scheduler.events import Installation

#: Most bytes of uploads and plugins kept for workers that join later.
MAX_KEPT_BYTES = 256 * 2**20


@dataclass
class Gather:
    """A client's gather relayed through the scheduler, until every worker answered."""

    client_id: str
    request_id: int
    #: worker id -> keys asked of it and not answered yet
    pending: dict[str, list[str]]
    data: dict[str, Pickled] = field(default_factory=dict)
    #: worker id -> large results on their way from it to the client (``PipeData``)
    piping: dict[str, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    #: Large results the client fetches itself: key -> its holders' data addresses.
    elsewhere: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Scatter:
    """A client's scatter placed on workers, until every worker stored its part."""

    client_id: str
    request_id: int
    pending: dict[str, list[str]]
    keys: list[str] = field(default_factory=list)


@dataclass
class Handoff:
    """One draining worker's results on their way to other workers."""

    source: str
    #: receiving worker id -> keys put there and not confirmed yet
    pending: dict[str, list[str]] = field(default_factory=dict)
    moved: int = 0


@dataclass
class RelayBook:
    """Relays in flight, by the request id the scheduler used towards workers."""

    gathers: dict[int, Gather] = field(default_factory=dict)
    scatters: dict[int, Scatter] = field(default_factory=dict)
    #: Results of draining workers on their way to others (``drain.py``).
    handoffs: dict[int, Handoff] = field(default_factory=dict)
    #: Scatter requests that arrived before any worker did.
    parked: list[tuple[str, ScatterRequest]] = field(default_factory=list)
    next_id: int = 0

    def new_id(self) -> int:
        """A request id no relay in flight uses."""
        self.next_id += 1
        return self.next_id

    def drop_parked(self, client_id: str, keys: list[str]) -> None:
        """The client gave up on these keys (a scatter that timed out): a parked request
        carrying them must not store them for nobody once a worker joins."""
        gone = set(keys)
        self.parked = [
            (c, req) for c, req in self.parked if c != client_id or not gone & req.data.keys()
        ]

    def drop_client(self, client_id: str) -> None:
        """A client left: nobody will read its relays' answers."""
        for book in (self.gathers, self.scatters):
            for rid in [rid for rid, r in book.items() if r.client_id == client_id]:
                del book[rid]
        self.parked = [(c, req) for c, req in self.parked if c != client_id]


@dataclass
class Call:
    """A client's call run on workers, until every chosen worker answered."""

    client_id: str
    request_id: int
    #: worker id -> its address, for the workers that have not answered yet
    pending: dict[str, str]
    #: worker address -> [status, value, traceback]
    results: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class RemoteBook:
    """Calls in flight, by the request id the scheduler used towards workers, and
    what every worker must have installed."""

    calls: dict[int, Call] = field(default_factory=dict)
    #: (kind, name) -> what is installed again on joining workers, oldest first.
    kept: dict[tuple[str, str], Installation] = field(default_factory=dict)
    #: This scheduler's Python and package versions (set by the service).
    versions: dict[str, Any] = field(default_factory=dict)
    #: Recent log records, newest last, at most ``n`` (``n <= 0``: all); set by the
    #: service, which owns the logging handler behind it.
    logs: Callable[[int], list[list[str]]] | None = None
    next_id: int = 0

    @property
    def kept_bytes(self) -> int:
        """Total size of the kept blobs; never above ``MAX_KEPT_BYTES``."""
        return sum(len(install.blob) for install in self.kept.values())

    def new_id(self) -> int:
        """A request id no call in flight uses."""
        self.next_id += 1
        return self.next_id

    def drop_client(self, client_id: str) -> None:
        """A client left: nobody will read its calls' answers."""
        for rid in [rid for rid, call in self.calls.items() if call.client_id == client_id]:
            del self.calls[rid]


#: source worker id -> key -> receiving worker ids
Plan = dict[str, dict[str, list[str]]]


@dataclass
class CopyJob:
    """One replicate or rebalance in flight, under the request id sent to workers."""

    client_id: str
    request_id: int
    #: Sources not heard from yet: worker id -> key -> receivers.
    plan: Plan
    #: A rebalance: the source lets its copy go once the receiver holds one.
    move: bool
    #: Receiver worker id -> ``PutData`` sent to it and not confirmed yet.
    puts: dict[str, int] = field(default_factory=dict)
    #: (key, receiver id) -> source id, for the moves relayed so far.
    origin: dict[tuple[str, str], str] = field(default_factory=dict)
    copied: int = 0
    dropped: int = 0


@dataclass
class SharedBook:
    """What clients left with the scheduler for each other."""

    #: name -> (pickled object, keys its futures refer to)
    datasets: dict[str, tuple[Pickled, list[str]]] = field(default_factory=dict)
    #: name -> the person who published it, for those a person published (the
    #: owner's are not here): a person sees and unpublishes only their own.
    publishers: dict[str, str] = field(default_factory=dict)
    #: Nested dictionaries of plain values (``set_metadata``).
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Replicates and rebalances in flight, by the request id sent to workers.
    copies: dict[int, CopyJob] = field(default_factory=dict)


@dataclass
class ServiceBook:
    """Which clients serve what (``task_hooks``); entries of clients that left are ignored."""

    #: Request kind (message class name) -> id of the client serving it.
    requests: dict[str, str] = field(default_factory=dict)
    #: Key prefix -> id of the client that adopts running tasks with such keys.
    prefixes: dict[str, str] = field(default_factory=dict)
    #: Names of workers removed during the current event (see ``flush``).
    departed: list[str] = field(default_factory=list)
    #: (worker id, key) of a task still running on a worker that joined, offered to
    #: its service and not adopted yet -> the notes the worker sent about it meanwhile
    #: (what it kept while no scheduler was up: a run's output, its end), given to
    #: the service once it adopts the task; dropped if it does not.
    unadopted: dict[tuple[str, str], list[bytes]] = field(default_factory=dict)
