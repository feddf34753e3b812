"""Variables, queues, events and topics shared by clients and tasks.

Values are opaque pickles (the scheduler never opens them) with the keys their
futures refer to. A variable's or a queue's keys are wanted by a pseudo-client of
its own (``variable:<name>``, ``queue:<name>``), as a published dataset's are, so
that the data outlives the client that put it there until the value is replaced,
deleted or taken. A client that gets a value wants its keys at once, in the same
step, before the pseudo-client lets go of them: the data is never left unwanted in
between.

A get, a put into a full queue or a wait on an event is answered when it can be
served, first come first served, or "timed out" at its deadline on a ``Tick``.
Topics (``Pub``/``Sub``) are routed here: a message goes once to each client with a
subscription to its topic when it is published, and to nobody else, ever.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import TypeVar

from apportion.core.payload import Pickled
from apportion.protocol.coordination import (
    CoordinationReply,
    EventRequest,
    Publish,
    Subscribe,
    Unsubscribe,
    ValueReply,
    ValueRequest,
)
from apportion.scheduler.client_requests import release, want
from apportion.scheduler.coordination_book import (
    QUEUE_OWNER,
    VARIABLE_OWNER,
    EventRecord,
    QueueGetter,
    QueuePutter,
    QueueRecord,
    VariableRecord,
    Waiter,
)
from apportion.scheduler.events import SendTopicMessage
from apportion.scheduler.records import ClientRecord, WorkerRecord
from apportion.scheduler.state import SchedulerState

_VALUE_OPS = {"variable": ("set", "get", "delete"), "queue": ("put", "get", "size")}


def value_request(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> None:
    error = _refusal(state, msg)
    if error:
        _answer(state, client.id, msg.request_id, error=error)
    elif msg.kind == "variable":
        _VARIABLE_OPS[msg.op](state, client, msg)
    else:
        _QUEUE_OPS[msg.op](state, client, msg)


def _refusal(state: SchedulerState, msg: ValueRequest) -> str:
    ops = _VALUE_OPS.get(msg.kind)
    if ops is None:
        return f"unknown kind {msg.kind!r} (expected variable or queue)"
    if msg.op not in ops:
        return f"unknown {msg.kind} operation {msg.op!r} (expected {', '.join(ops)})"
    if msg.op in ("set", "put") and len(msg.items) != 1:
        return f"a {msg.op} carries one value, not {len(msg.items)}"
    if msg.count < 0 or msg.maxsize < 0:
        return "count and maxsize cannot be negative"
    unknown = [key for key in msg.keys if key not in state.tasks]
    if unknown:
        return (
            f"futures {unknown} are unknown to the scheduler (released, or of a "
            "cluster that was restarted): they cannot be shared"
        )
    return ""


def _answer(
    state: SchedulerState,
    client_id: str,
    request_id: int,
    items: list[Pickled] | None = None,
    keys: list[str] | None = None,
    size: int = 0,
    timed_out: bool = False,
    error: str = "",
) -> None:
    reply = ValueReply(request_id, items or [], keys or [], size, int(timed_out), error)
    state.reply(client_id, reply)


def _deadline(state: SchedulerState, timeout: float) -> float:
    return state.now + timeout if timeout >= 0 else math.inf


def _owner(state: SchedulerState, owner_id: str) -> ClientRecord:
    """The pseudo-client wanting a variable's or a queue's keys (made on first use)."""
    owner = state.clients.get(owner_id)
    if owner is None:
        owner = state.clients[owner_id] = ClientRecord(owner_id)
        state.coordination.owners.add(owner_id)
    return owner


def drop_owner(state: SchedulerState, owner_id: str) -> None:
    """The pseudo-client holds nothing any more: it goes."""
    owner = state.clients.pop(owner_id, None)
    if owner is None:
        return
    state.coordination.owners.discard(owner_id)
    state.coordination.gone_owners.add(owner_id)
    if owner.wanted:
        release(state, owner, sorted(owner.wanted))


def _hand_over(
    state: SchedulerState, waiter: Waiter, items: list[tuple[Pickled, list[str]]]
) -> None:
    """Answer a get with ``items``: its client wants their keys from now on."""
    keys = list(dict.fromkeys(key for _, item_keys in items for key in item_keys))
    client = state.clients[waiter.client_id]
    for key in keys:
        want(state, client, key)
    data = [blob for blob, _ in items]
    _answer(state, waiter.client_id, waiter.request_id, items=data, keys=keys)


# --- variables ------------------------------------------------------------------------


def _set_variable(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> None:
    book = state.coordination
    owner_id = VARIABLE_OWNER + msg.name
    if msg.keys:
        owner = _owner(state, owner_id)
        # Keys in both values stay wanted; the new ones are wanted before the old go
        # (one may be computed from an old one).
        dropped = sorted(owner.wanted - set(msg.keys))
        for key in msg.keys:
            want(state, owner, key)
        release(state, owner, dropped)
    else:
        drop_owner(state, owner_id)
    book.variables[msg.name] = VariableRecord(msg.items[0], list(msg.keys))
    _answer(state, client.id, msg.request_id)
    for waiter in book.variable_waiters.pop(msg.name, []):
        _hand_over(state, waiter, [(msg.items[0], list(msg.keys))])


def _get_variable(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> None:
    book = state.coordination
    record = book.variables.get(msg.name)
    waiter = Waiter(client.id, msg.request_id, _deadline(state, msg.timeout))
    if record is not None:
        _hand_over(state, waiter, [(record.data, record.keys)])
    elif msg.timeout == 0:
        _answer(state, client.id, msg.request_id, timed_out=True)
    else:
        book.variable_waiters.setdefault(msg.name, []).append(waiter)
        book.due(waiter.deadline)


def _delete_variable(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> None:
    """Forget the value (a name never set is no error, as in Dask); gets wait on."""
    if state.coordination.variables.pop(msg.name, None) is not None:
        drop_owner(state, VARIABLE_OWNER + msg.name)
    _answer(state, client.id, msg.request_id)


_VARIABLE_OPS = {"set": _set_variable, "get": _get_variable, "delete": _delete_variable}


# --- queues ---------------------------------------------------------------------------


def _queue(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> QueueRecord | None:
    """The queue, made on first use with the asker's ``maxsize``; None (answered with
    the error) when the asker was made with another bound."""
    record = state.coordination.queues.get(msg.name)
    if record is None:
        record = state.coordination.queues[msg.name] = QueueRecord(msg.maxsize)
    elif record.maxsize != msg.maxsize:
        text = (
            f"Inconsistent maxsize for queue {msg.name!r}: {msg.maxsize}, "
            f"expected: {record.maxsize}"
        )
        _answer(state, client.id, msg.request_id, error=text)
        return None
    return record


def _put(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> None:
    record = _queue(state, client, msg)
    if record is None:
        return
    putter = QueuePutter(
        client.id, msg.request_id, _deadline(state, msg.timeout), msg.items[0], list(msg.keys)
    )
    _hold_keys(state, msg.name, record, putter.keys)
    _wait_in_line(state, msg, record.putters, putter)


def _get(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> None:
    record = _queue(state, client, msg)
    if record is None:
        return
    if msg.count == 0:
        # ``batch=True``: whatever is there now, without waiting; gets already
        # waiting have the first claim on it.
        count = 0 if record.getters else len(record.items)
        _serve(state, msg.name, record, QueueGetter(client.id, msg.request_id, state.now, count))
        settle_queue(state, msg.name)
        return
    getter = QueueGetter(client.id, msg.request_id, _deadline(state, msg.timeout), msg.count)
    _wait_in_line(state, msg, record.getters, getter)


#: A put or a get: each waits in a line of its own kind.
InLine = TypeVar("InLine", QueuePutter, QueueGetter)


def _wait_in_line(
    state: SchedulerState,
    msg: ValueRequest,
    line: deque[InLine],
    waiter: InLine,
) -> None:
    """``waiter`` joins ``line``; served at once if it can be, else answered "timed
    out" now (a timeout of 0) or at its deadline."""
    line.append(waiter)
    settle_queue(state, msg.name)
    if waiter not in line:
        return  # served
    if msg.timeout == 0:
        drop_waiters(state, msg.name, [waiter], answer=True)
    else:
        state.coordination.due(waiter.deadline)


def _size(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> None:
    record = state.coordination.queues.get(msg.name)
    _answer(state, client.id, msg.request_id, size=len(record.items) if record else 0)


_QUEUE_OPS = {"put": _put, "get": _get, "size": _size}


def _hold_keys(state: SchedulerState, name: str, record: QueueRecord, keys: list[str]) -> None:
    owner = _owner(state, QUEUE_OWNER + name) if keys else None
    for key in keys:
        record.key_counts[key] += 1
        if owner is not None and record.key_counts[key] == 1:
            want(state, owner, key)


def _let_go(state: SchedulerState, name: str, record: QueueRecord, keys: list[str]) -> None:
    gone = []
    for key in keys:
        record.key_counts[key] -= 1
        if record.key_counts[key] == 0:
            del record.key_counts[key]
            gone.append(key)
    owner = state.clients.get(QUEUE_OWNER + name)
    if gone and owner is not None:
        release(state, owner, gone)
    if not record.key_counts:
        drop_owner(state, QUEUE_OWNER + name)


def _serve(state: SchedulerState, name: str, record: QueueRecord, getter: QueueGetter) -> None:
    taken = [record.items.popleft() for _ in range(getter.count)]
    _hand_over(state, getter, taken)  # the getter wants the keys before the queue lets go
    _let_go(state, name, record, [key for _, keys in taken for key in keys])


def settle_queue(state: SchedulerState, name: str) -> None:
    """Let waiting puts in while there is room and serve waiting gets while there are
    enough items, in order; drop the queue once empty with nobody waiting."""
    record = state.coordination.queues[name]
    moved = True
    while moved:
        moved = False
        while record.putters and (not record.maxsize or len(record.items) < record.maxsize):
            putter = record.putters.popleft()
            record.items.append((putter.data, putter.keys))
            _answer(state, putter.client_id, putter.request_id)
            moved = True
        while record.getters and len(record.items) >= record.getters[0].count:
            _serve(state, name, record, record.getters.popleft())
            moved = True
    if not (record.items or record.getters or record.putters):
        del state.coordination.queues[name]


def drop_waiters(state: SchedulerState, name: str, waiters: list[Waiter], *, answer: bool) -> None:
    """These gets and puts stop waiting (answered "timed out" if ``answer``): a put's
    item never goes in, and those behind them may be served now."""
    record = state.coordination.queues[name]
    for waiter in waiters:
        if isinstance(waiter, QueuePutter):
            record.putters.remove(waiter)
            _let_go(state, name, record, waiter.keys)
        elif isinstance(waiter, QueueGetter):
            record.getters.remove(waiter)
        if answer:
            _answer(state, waiter.client_id, waiter.request_id, timed_out=True)
    settle_queue(state, name)


# --- events ---------------------------------------------------------------------------


def event_request(state: SchedulerState, client: ClientRecord, msg: EventRequest) -> None:
    book = state.coordination
    record = book.events.get(msg.name)
    if msg.op == "set":
        record = book.events.setdefault(msg.name, EventRecord())
        record.is_set = True
        for waiter in record.waiters:
            _flag(state, waiter.client_id, waiter.request_id, True)
        record.waiters.clear()
        _flag(state, client.id, msg.request_id, True)
    elif msg.op == "clear":
        if record is not None:
            record.is_set = False
            tidy_event(state, msg.name)
        _flag(state, client.id, msg.request_id, False)
    elif msg.op == "is_set":
        _flag(state, client.id, msg.request_id, record is not None and record.is_set)
    elif msg.op == "wait":
        if record is not None and record.is_set:
            _flag(state, client.id, msg.request_id, True)
        elif msg.timeout == 0:
            _flag(state, client.id, msg.request_id, False)
        else:
            waiter = Waiter(client.id, msg.request_id, _deadline(state, msg.timeout))
            book.events.setdefault(msg.name, EventRecord()).waiters.append(waiter)
            book.due(waiter.deadline)
    else:
        text = f"unknown event operation {msg.op!r} (expected set, clear, is_set or wait)"
        state.reply(client.id, CoordinationReply(msg.request_id, 0, 0, text))


def _flag(state: SchedulerState, client_id: str, request_id: int, is_set: bool) -> None:
    state.reply(client_id, CoordinationReply(request_id, int(is_set), 0, ""))


def tidy_event(state: SchedulerState, name: str) -> None:
    """A clear event nobody waits for is the same as none: forget it."""
    record = state.coordination.events[name]
    if not record.is_set and not record.waiters:
        del state.coordination.events[name]


# --- topics ---------------------------------------------------------------------------


def subscribe(state: SchedulerState, client: ClientRecord, msg: Subscribe) -> None:
    state.coordination.topics.setdefault(msg.name, Counter())[client.id] += 1
    state.reply(client.id, CoordinationReply(msg.request_id, 1, 0, ""))


def unsubscribe(state: SchedulerState, client: ClientRecord, msg: Unsubscribe) -> None:
    subscribers = state.coordination.topics.get(msg.name)
    if subscribers is None or not subscribers[client.id]:
        return  # its subscription ended before it was made (a Sub dropped at once)
    subscribers[client.id] -= 1
    if not subscribers[client.id]:
        del subscribers[client.id]
        if not subscribers:
            del state.coordination.topics[msg.name]


def publish(state: SchedulerState, sender: ClientRecord | WorkerRecord, msg: Publish) -> None:
    """To every client subscribed to the topic, from a client's ``Pub`` or, for Dask's
    ``print`` and ``warn`` topics, from a task through its worker."""
    for client_id in state.coordination.topics.get(msg.name, ()):
        state.emit(SendTopicMessage(client_id, msg.name, msg.data))


# --- time and departures --------------------------------------------------------------


def expire(state: SchedulerState) -> float:
    """Answer every get, put and wait past its deadline; return the next deadline."""
    book = state.coordination
    now = state.now
    for name, waiters in list(book.variable_waiters.items()):
        late = [w for w in waiters if w.deadline <= now]
        for waiter in late:
            waiters.remove(waiter)
            _answer(state, waiter.client_id, waiter.request_id, timed_out=True)
        if not waiters:
            del book.variable_waiters[name]
    for name, record in list(book.queues.items()):
        late = [w for w in (*record.getters, *record.putters) if w.deadline <= now]
        if late:
            drop_waiters(state, name, late, answer=True)
    for name, event in list(book.events.items()):
        for waiter in [w for w in event.waiters if w.deadline <= now]:
            event.waiters.remove(waiter)
            _flag(state, waiter.client_id, waiter.request_id, False)
        tidy_event(state, name)
    return min(_deadlines(state), default=math.inf)


def _deadlines(state: SchedulerState) -> list[float]:
    book = state.coordination
    due = [w.deadline for waiters in book.variable_waiters.values() for w in waiters]
    for record in book.queues.values():
        due += [w.deadline for w in (*record.getters, *record.putters)]
    due += [w.deadline for event in book.events.values() for w in event.waiters]
    return due


def client_left(state: SchedulerState, client_id: str) -> None:
    """A client left: its gets, puts and waits stop waiting, its subscriptions end."""
    book = state.coordination
    for name, waiters in list(book.variable_waiters.items()):
        waiters[:] = [w for w in waiters if w.client_id != client_id]
        if not waiters:
            del book.variable_waiters[name]
    for name, record in list(book.queues.items()):
        mine = [w for w in (*record.getters, *record.putters) if w.client_id == client_id]
        if mine:
            drop_waiters(state, name, mine, answer=False)
    for name, event in list(book.events.items()):
        event.waiters[:] = [w for w in event.waiters if w.client_id != client_id]
        tidy_event(state, name)
    for name, subscribers in list(book.topics.items()):
        subscribers.pop(client_id, None)
        if not subscribers:
            del book.topics[name]
