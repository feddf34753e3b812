"""Coordination as a whole: fire-and-forget, time, departures, restarts and invariants.

The primitives themselves are in ``leases.py`` (semaphores, locks, multi-locks) and
``channels.py`` (variables, queues, events, topics); their state is one book,
``SchedulerState.coordination`` (``coordination_book.py``). This module is what the
rest of the scheduler calls: ``tick`` on every ``Tick``, ``client_left`` when a
client goes, ``restarted`` after a restart, and ``read_notices`` on the commands of
every event.

``fire_and_forget`` keys are wanted by one pseudo-client, ``fire-and-forget``, until
they finish (in memory, failed, cancelled or lost): it hears of that as any client
would, through the notices the core addresses to it, which ``read_notices`` reads
instead of sending, and then lets the keys go, so their data is freed once no real
client wants it. Notices to the other pseudo-clients of this book (variables,
queues) are dropped the same way: nobody would receive them.
"""

from __future__ import annotations

import math
from collections import deque

from apportion.protocol.coordination import ValueReply
from apportion.protocol.tasks import FireAndForget
from apportion.scheduler import channels, leases
from apportion.scheduler.client_requests import release, want
from apportion.scheduler.coordination_book import (
    FIRE_AND_FORGET,
    QUEUE_OWNER,
    VARIABLE_OWNER,
    QueuePutter,
)
from apportion.scheduler.events import (
    Command,
    SendKeysDone,
    SendKeysFailed,
    SendKeysPending,
    SendTaskErred,
)
from apportion.scheduler.records import ClientRecord
from apportion.scheduler.state import SchedulerState

#: Notices the core addresses to clients about their keys.
_NOTICES = (SendKeysDone, SendKeysPending, SendKeysFailed, SendTaskErred)


def fire_and_forget(state: SchedulerState, client: ClientRecord, msg: FireAndForget) -> None:
    """Run these keys to the end whoever else wants them."""
    if not msg.keys:
        return  # nothing to hold: no pseudo-client for it
    owner = state.clients.get(FIRE_AND_FORGET)
    if owner is None:
        owner = state.clients[FIRE_AND_FORGET] = ClientRecord(FIRE_AND_FORGET)
        state.coordination.owners.add(FIRE_AND_FORGET)
    for key in msg.keys:
        want(state, owner, key)  # one already finished is let go in ``read_notices``


def read_notices(state: SchedulerState, commands: list[Command]) -> list[Command]:
    """``commands`` without the notices to this book's pseudo-clients; the keys
    fire-and-forget was told are finished are let go, with what that leads to."""
    book = state.coordination
    if not book.owners and not book.gone_owners:
        return commands
    owners = book.owners | book.gone_owners
    book.gone_owners.clear()
    out: list[Command] = []
    finished: list[str] = []
    for command in commands:
        if isinstance(command, _NOTICES) and command.client_id in owners:
            if command.client_id == FIRE_AND_FORGET:
                finished += _settled_keys(command)
            continue
        out.append(command)
    owner = state.clients.get(FIRE_AND_FORGET)
    if finished and owner is not None:
        release(state, owner, finished)
        if not owner.wanted:
            del state.clients[FIRE_AND_FORGET]
            book.owners.discard(FIRE_AND_FORGET)
        out += read_notices(state, state.take_commands())
    return out


def _settled_keys(
    notice: SendKeysDone | SendKeysPending | SendKeysFailed | SendTaskErred,
) -> list[str]:
    """The keys a notice says are finished (done, failed); none for "pending again"."""
    if isinstance(notice, SendTaskErred):
        return [notice.key]
    if isinstance(notice, SendKeysPending):
        return []
    return notice.keys


def tick(state: SchedulerState) -> None:
    """Answer what waited past its deadline, end the leases past their timeout."""
    book = state.coordination
    if state.now < book.next_due:
        return
    book.next_due = math.inf
    book.due(min(leases.expire(state), channels.expire(state)))


def client_left(state: SchedulerState, client_id: str) -> None:
    """Its leases end and nothing of it waits any more (it will read no answer)."""
    leases.client_left(state, client_id)
    channels.client_left(state, client_id)


def restarted(state: SchedulerState) -> None:
    """After a restart, every task is gone: values referring to results go with them
    (plain ones stay), and so does what fire-and-forget held."""
    book = state.coordination
    for name in [n for n, record in book.variables.items() if record.keys]:
        del book.variables[name]
    for name, record in list(book.queues.items()):
        record.items = deque(item for item in record.items if not item[1])
        refused = [p for p in record.putters if p.keys]
        for putter in refused:
            record.putters.remove(putter)
            text = "the cluster was restarted: the futures of this put are gone"
            reply = ValueReply(putter.request_id, [], [], 0, 0, text)
            state.reply(putter.client_id, reply)
        record.key_counts.clear()
        channels.settle_queue(state, name)
    for owner_id in list(book.owners):
        # What they still want (durable work kept by the restart) is let go.
        channels.drop_owner(state, owner_id)


# --- invariants -----------------------------------------------------------------------


def check_book(state: SchedulerState) -> None:
    """Raise ``AssertionError`` naming the first broken invariant of the book."""
    _check_leases(state)
    _check_channels(state)
    book = state.coordination
    for owner_id in book.owners:
        assert owner_id in state.clients, f"pseudo-client {owner_id} forgotten"
    fired = state.clients.get(FIRE_AND_FORGET)
    assert fired is None or fired.wanted, "fire-and-forget kept with nothing to hold"


def _check_leases(state: SchedulerState) -> None:
    book = state.coordination
    held: set[str] = set()
    for kind, pools in book.pools.items():
        for name, pool in pools.items():
            assert pool.holders or pool.queue, f"{kind} {name}: idle pool kept"
            assert len(pool.holders) <= pool.max_leases, f"{kind} {name}: over max_leases"
            for lease_id, lease in pool.holders.items():
                assert book.leases.get(lease_id) is lease and name in lease.names
                held.add(lease_id)
            for waiter in pool.queue:
                assert waiter.client_id in state.clients, f"{name}: waiter of a gone client"
                assert waiter.deadline >= book.next_due, f"{name}: deadline before next_due"
                assert waiter.lease_id not in book.leases, f"{name}: granted and waiting"
            if pool.queue:
                head = pool.queue[0]
                ready = [n for n in head.names if pools[n].queue[0] is head and pools[n].free]
                assert len(ready) < head.count, f"{kind} {name}: grantable head left waiting"
    assert held == set(book.leases), "leases not held on their names"
    for lease in book.leases.values():
        assert lease.client_id in state.clients, f"lease {lease.lease_id} of a gone client"
        assert lease.expires >= book.next_due, f"lease {lease.lease_id} expires unnoticed"


def _check_channels(state: SchedulerState) -> None:
    book = state.coordination
    for name, variable in book.variables.items():
        owner = state.clients.get(VARIABLE_OWNER + name)
        held = owner.wanted if owner is not None else set()
        assert held == set(variable.keys), f"variable {name}: keys not held by its pseudo-client"
    for name, record in book.queues.items():
        assert record.items or record.getters or record.putters, f"queue {name}: idle kept"
        counts: dict[str, int] = {}
        for keys in [k for _, k in record.items] + [p.keys for p in record.putters]:
            for key in keys:
                counts[key] = counts.get(key, 0) + 1
        assert counts == dict(record.key_counts), f"queue {name}: key counts drifted"
        owner = state.clients.get(QUEUE_OWNER + name)
        assert (owner.wanted if owner else set()) == set(counts), f"queue {name}: keys unheld"
        if record.getters:
            assert len(record.items) < record.getters[0].count, f"queue {name}: get left waiting"
        if record.putters:
            assert record.maxsize and len(record.items) >= record.maxsize, f"queue {name}: put"
        for waiter in (*record.getters, *record.putters):
            assert waiter.client_id in state.clients, f"queue {name}: waiter of a gone client"
            assert waiter.deadline >= book.next_due, f"queue {name}: deadline unnoticed"
            assert not isinstance(waiter, QueuePutter) or waiter.data is not None
    for name, event in book.events.items():
        assert event.is_set or event.waiters, f"event {name}: idle kept"
        assert not (event.is_set and event.waiters), f"event {name}: set with waiters"
    waiting = [w for ws in book.variable_waiters.values() for w in ws]
    waiting += [w for event in book.events.values() for w in event.waiters]
    for waiter in waiting:
        assert waiter.client_id in state.clients, "a waiter of a gone client"
        assert waiter.deadline >= book.next_due, "a deadline before next_due"
    for name, subscribers in book.topics.items():
        assert subscribers and all(n > 0 for n in subscribers.values()), f"topic {name}"
        assert set(subscribers) <= set(state.clients), f"topic {name}: gone subscriber"
