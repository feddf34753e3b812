"""What a client knows about its keys, as data: scheduler messages in, outcomes out.

Theory of operation. Every ``Future`` of a client counts as one reference to its
key (``ref``/``unref``). A key is the scheduler's to keep while it has a reference;
when its last one goes, the key is forgotten here and one ``Release`` comes out,
for the shell to post. A key is *pending* until the scheduler reports it done,
erred or failed (``handle``), or until this client cancels it (``cancel``) or
loses the scheduler (``scheduler_lost``); then it is *settled*, and one
``Settled`` comes out. A settled key goes back to pending (``Reset``) when the
scheduler says it is being computed again (a result lost with its worker, a
``retry``), or when this client submits it again after cancelling it. What is to
run once a key settles (a future's done-callbacks, an awaiting coroutine's wake-up,
``as_completed``) is kept with it (``add_callback``) and handed out, once, with its
``Settled``.

The scheduler answers a cancel from this client with its own "cancelled" for the
key: that echo must not cancel a run of the same key submitted again in between,
so a key cancelled here ignores the next "cancelled" it hears (``cancel_echo``).

No threads, locks, events or clocks: the shell (``Client``) holds a lock around
these calls, and turns each outcome into a waiter woken, a release posted, a
notice logged, a topic message delivered.

``PendingRequests`` is the same for the session's requests: which ids await a
reply, where each went, and the parts forwarded ahead of a reply; the session
(session.py) keeps only the awaitables.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Literal

from apportion.core.payload import Pickled
from apportion.protocol.base import Message
from apportion.protocol.coordination import TopicMessage
from apportion.protocol.peer_data import DataReply
from apportion.protocol.tasks import KeysDone, KeysFailed, KeysPending, Notice, TaskErred

#: Why a key failed: (kind, pickled exception or message, pickled traceback or b"").
Failure = tuple[str, Pickled | str, Pickled]

PENDING = "pending"
FINISHED = "finished"
ERROR = "error"
CANCELLED = "cancelled"
LOST = "lost"

#: Statuses a key has once settled (every status but pending).
SETTLED = frozenset({FINISHED, ERROR, CANCELLED, LOST})


@dataclass(slots=True)
class KeyRecord:
    """One key, as this client knows it."""

    #: PENDING until settled, then one of ``SETTLED``.
    status: str = PENDING
    #: Set exactly when the status is ERROR, CANCELLED or LOST.
    error: Failure | None = None
    #: Live futures of this key; a record with none is not kept.
    refs: int = 0
    #: How many runs raised (retries included) when the task failed.
    attempts: int = 1
    #: Its result's type name, as its worker (or this client, for data it scattered)
    #: named it; "" until known. ``Future.type`` turns it into the class.
    type_name: str = ""
    #: Cancelled here; the scheduler's own "cancelled" for it is still to come.
    cancel_echo: bool = False
    #: What to run once it settles (done-callbacks, awaiting coroutines, as_completed),
    #: handed out with its ``Settled``; None while there is nothing.
    callbacks: list[Callable[[], None]] | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """``key`` is settled: wake whoever waits for it, and run ``callbacks``."""

    key: str
    status: str
    error: Failure | None
    callbacks: tuple[Callable[[], None], ...] = ()


@dataclass(frozen=True, slots=True)
class Reset:
    """``key`` is pending again: waiting for it waits anew."""

    key: str


@dataclass(frozen=True, slots=True)
class Release:
    """The last reference to ``key`` went: tell the scheduler it may drop it."""

    key: str


@dataclass(frozen=True, slots=True)
class NoticeText:
    """A warning the scheduler sent (a request no worker can meet, ...)."""

    text: str


@dataclass(frozen=True, slots=True)
class Deliver:
    """A message published on a topic this client subscribed to."""

    message: TopicMessage


@dataclass(frozen=True, slots=True)
class Unexpected:
    """A message a client has no use for: logged, not acted on."""

    name: str


Outcome = Settled | Reset | Release | NoticeText | Deliver | Unexpected


@dataclass
class ClientState:
    """The keys a client holds futures of; see the module docstring."""

    #: Every key with at least one live future, and nothing else.
    keys: dict[str, KeyRecord] = field(default_factory=dict)
    #: No more releases once closed: the scheduler forgets the client's keys itself.
    closed: bool = False

    # --- references -------------------------------------------------------------------

    def ref(self, key: str) -> KeyRecord:
        """One more future of ``key``; its record (new and pending if it had none)."""
        record = self.keys.get(key)
        if record is None:
            record = self.keys[key] = KeyRecord()
        record.refs += 1
        return record

    def unref(self, key: str) -> Release | None:
        """One future of ``key`` fewer; a ``Release`` when that was the last one."""
        record = self.keys.get(key)
        if record is None:
            return None
        record.refs -= 1
        if record.refs > 0:
            return None
        del self.keys[key]
        return None if self.closed else Release(key)

    # --- what this client does --------------------------------------------------------

    def resubmitted(self, key: str) -> Reset | None:
        """``key`` is submitted again: a cancelled one runs again, so it is pending."""
        record = self.keys.get(key)
        if record is None or record.status != CANCELLED:
            return None
        return self._reset(key, record)

    def retried(self, key: str) -> Reset | None:
        """``retry`` of a failed ``key``: pending before the request goes, so that the
        outcome of the new run finds it waiting."""
        record = self.keys.get(key)
        if record is None or record.status != ERROR:
            return None
        return self._reset(key, record)

    def cancel(self, keys: list[str]) -> list[Settled]:
        """Cancelled here: each key not settled yet settles as cancelled at once (a
        finished result stays finished), and expects the scheduler's echo."""
        out = []
        for key in keys:
            record = self.keys.get(key)
            if record is None or record.status != PENDING:
                continue
            out.append(
                self._settle(key, record, CANCELLED, ("cancelled", f"{key!r} was cancelled", b""))
            )
            record.cancel_echo = True
        return out

    def scheduler_lost(self, reason: str, kind: str = "gone") -> list[Settled]:
        """Nothing more will come from the scheduler: every pending key settles as lost,
        with ``kind`` "gone" (``SchedulerGoneError``) or, once closed, "lost"."""
        error: Failure = (kind, reason, b"")
        return [
            self._settle(key, record, LOST, error)
            for key, record in self.keys.items()
            if record.status == PENDING
        ]

    def close(self) -> None:
        """The client is closing: futures dropped from now on release nothing."""
        self.closed = True

    # --- what the scheduler says ------------------------------------------------------

    def handle(self, msg: Message) -> list[Outcome]:
        """The outcomes of one message from the scheduler (replies excepted: the
        session matches those to their requests)."""
        if isinstance(msg, KeysDone):
            for key, name in zip(msg.keys, msg.types, strict=False):
                record = self.keys.get(key)
                if name and record is not None:
                    record.type_name = name  # "": unknown here; what this client knew stays
            return self._settle_all(msg.keys, FINISHED, None)
        if isinstance(msg, TaskErred):
            record = self.keys.get(msg.key)
            if record is not None:
                record.attempts = msg.attempts
            return self._settle_all([msg.key], ERROR, ("exception", msg.exception, msg.traceback))
        if isinstance(msg, KeysFailed):
            status = CANCELLED if msg.kind == "cancelled" else ERROR
            return self._settle_all(msg.keys, status, (msg.kind, msg.message, b""))
        if isinstance(msg, KeysPending):
            # Lost results, or failed ones run again by ``retry``: pending again.
            out: list[Outcome] = []
            for key in msg.keys:
                record = self.keys.get(key)
                if record is not None and record.status in (FINISHED, ERROR):
                    out.append(self._reset(key, record))
            return out
        if isinstance(msg, TopicMessage):
            return [Deliver(msg)]
        if isinstance(msg, Notice):
            return [NoticeText(msg.text)]
        return [Unexpected(type(msg).__name__)]

    def _settle_all(self, keys: list[str], status: str, error: Failure | None) -> list[Outcome]:
        out: list[Outcome] = []
        for key in keys:
            record = self.keys.get(key)
            if record is None:
                continue  # released meanwhile: nobody waits for it
            if record.cancel_echo:
                record.cancel_echo = False
                if status == CANCELLED:
                    continue  # the echo of our own cancel: settled already, or resubmitted
            if record.status == PENDING:
                out.append(self._settle(key, record, status, error))
        return out

    def add_callback(self, key: str, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when ``key`` settles; False if it has already (or is not
        held here): then the caller runs it itself."""
        record = self.keys.get(key)
        if record is None or record.status != PENDING:
            return False
        if record.callbacks is None:
            record.callbacks = [callback]
        else:
            record.callbacks.append(callback)
        return True

    @staticmethod
    def _settle(key: str, record: KeyRecord, status: str, error: Failure | None) -> Settled:
        record.status = status
        record.error = error
        callbacks, record.callbacks = record.callbacks, None
        return Settled(key, status, error, tuple(callbacks) if callbacks else ())

    @staticmethod
    def _reset(key: str, record: KeyRecord) -> Reset:
        record.status = PENDING
        record.error = None
        return Reset(key)


def check_invariants(state: ClientState) -> None:
    """Raise ``AssertionError`` where ``state`` breaks what its fields promise."""
    for key, record in state.keys.items():
        assert record.refs > 0, f"{key!r} kept with no reference"
        assert record.status == PENDING or record.status in SETTLED, record.status
        assert record.status == PENDING or not record.callbacks, f"{key!r}: callbacks kept"
        if record.status in (PENDING, FINISHED):
            assert record.error is None, f"{key!r} {record.status} with an error"
        else:
            assert record.error is not None, f"{key!r} {record.status} without an error"


#: What ``PendingRequests.receive`` made of a message: the id of the request it
#: answers, a forwarded part kept for a later reply, or a notice for the client.
Received = int | Literal["kept", "notice"]


class PendingRequests:
    """The requests a client's session waits for replies to, as data.

    Each request gets an id (``next_id``) and is pending from ``send`` until the
    message carrying that id arrives (``receive``), or until the worker connection
    it went on closes (``peer_lost``: it gets no answer). A request given up by its
    caller (cancelled, timed out) stays pending until its reply, whose forwarded
    parts are then dropped (``drop_parts``). The session keeps only the awaitables,
    by the same ids.
    """

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        #: Pending request id -> the peer (a worker's data connection) it was sent
        #: on, or None for the scheduler.
        self.sent: dict[int, Hashable | None] = {}
        #: Large results the scheduler forwarded from workers ahead of its reply to a
        #: relayed gather, by request id, until taken (``take_parts``).
        self.parts: dict[int, list[DataReply]] = {}

    def next_id(self) -> int:
        """A request id this session has not used."""
        return next(self._ids)

    def send(self, request_id: int, peer: Hashable | None = None) -> None:
        """``request_id`` sent to the scheduler (``peer`` None) or on ``peer``."""
        self.sent[request_id] = peer

    def receive(self, msg: Message, peer: Hashable | None = None) -> Received:
        """``msg`` arrived from the scheduler (``peer`` None) or from ``peer``: the id
        of the pending request it answers (pending no more), "kept" for a result the
        scheduler forwarded ahead of its reply, or "notice"."""
        if peer is None and isinstance(msg, DataReply):
            self.parts.setdefault(msg.request_id, []).append(msg)
            return "kept"
        request_id = getattr(msg, "request_id", None)
        if not isinstance(request_id, int) or request_id not in self.sent:
            return "notice"
        del self.sent[request_id]
        return request_id

    def peer_lost(self, peer: Hashable) -> list[int]:
        """The requests sent on ``peer``, which closed: none will be answered."""
        lost = [request_id for request_id, on in self.sent.items() if on is peer]
        for request_id in lost:
            del self.sent[request_id]
        return lost

    def take_parts(self, request_id: int) -> list[DataReply]:
        """The results forwarded ahead of the reply to ``request_id``, once."""
        return self.parts.pop(request_id, [])

    def drop_parts(self, request_id: int) -> None:
        """The reply to ``request_id`` came after its caller gave up: so do its parts."""
        self.parts.pop(request_id, None)
