"""Semaphores, locks and multi-locks: leases on names, granted first come first served.

A ``Lock`` is a semaphore with one lease, as in Dask; a ``MultiLock`` takes several
names of its own namespace at once. An acquire waits in the queue of each name it
asks for and is granted when it is at the head of enough of them with a lease free
there: then it takes them all at once. Nothing is held while waiting, and a later
acquire never overtakes an earlier one on a name they share, so two multi-locks
taking overlapping names in different orders cannot deadlock, and nobody starves.

A lease ends when released, when its client leaves (a crashed holder), or when its
holder has not refreshed it for its lease timeout (a holder alive on the network
but stuck): its names then go to the next in line. An acquire with a timeout is
answered "not granted" at its deadline, on a ``Tick``; the client never gives up on
its own, so a grant cannot cross a client that stopped waiting.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from apportion.protocol.coordination import CoordinationReply, LeaseRequest, RefreshLeases
from apportion.scheduler.coordination_book import (
    LEASE_KINDS,
    SEMAPHORE,
    Lease,
    LeasePool,
    LeaseWaiter,
)
from apportion.scheduler.events import SendNotice
from apportion.scheduler.records import ClientRecord
from apportion.scheduler.state import SchedulerState


def lease_request(state: SchedulerState, client: ClientRecord, msg: LeaseRequest) -> None:
    error = _refusal(msg)
    if error:
        _answer(state, client.id, msg.request_id, error=error)
    elif msg.op == "acquire":
        _acquire(state, client, msg)
    elif msg.op == "release":
        _release(state, client, msg)
    else:  # "value"
        pool = state.coordination.pools[msg.kind].get(msg.names[0])
        _answer(state, client.id, msg.request_id, value=len(pool.holders) if pool else 0)


def _refusal(msg: LeaseRequest) -> str:
    """Why the request cannot be served as it is ("" if it can)."""
    if msg.kind not in LEASE_KINDS:
        return f"unknown kind of lease {msg.kind!r} (expected one of {', '.join(LEASE_KINDS)})"
    if msg.op not in ("acquire", "release", "value"):
        return f"unknown lease operation {msg.op!r} (expected acquire, release or value)"
    if not msg.names:
        return f"a {msg.kind} request needs a name"
    if msg.op != "acquire":
        return ""
    if len(set(msg.names)) != len(msg.names):
        return f"names given twice: {msg.names}"
    if not 1 <= msg.count <= len(msg.names):
        return f"cannot take {msg.count} of {len(msg.names)} names"
    if msg.kind == SEMAPHORE and len(msg.names) != 1:
        return "a semaphore has one name"
    if msg.max_leases < 1:
        return f"max_leases must be at least 1, not {msg.max_leases}"
    if not msg.lease_id:
        return "an acquire needs a lease id"
    if msg.lease_timeout < 0 or math.isnan(msg.lease_timeout):
        return f"lease timeout {msg.lease_timeout} must be 0 (none) or more"
    return ""


def _answer(
    state: SchedulerState,
    client_id: str,
    request_id: int,
    ok: int = 0,
    value: int = 0,
    error: str = "",
) -> None:
    state.reply(client_id, CoordinationReply(request_id, ok, value, error))


def _acquire(state: SchedulerState, client: ClientRecord, msg: LeaseRequest) -> None:
    book = state.coordination
    held = book.leases.get(msg.lease_id)
    if held is not None:
        # The same lease asked again (a retried request): it is held already.
        _answer(state, client.id, msg.request_id, ok=int(held.client_id == client.id))
        return
    pools = book.pools[msg.kind]
    capacity = msg.max_leases if msg.kind == SEMAPHORE else 1
    for name in msg.names:
        pool = pools.get(name)
        if pool is not None and pool.max_leases != capacity:
            text = f"Inconsistent max leases for {name!r}: {capacity}, expected: {pool.max_leases}"
            _answer(state, client.id, msg.request_id, error=text)
            return
    deadline = state.now + msg.timeout if msg.timeout >= 0 else math.inf
    waiter = LeaseWaiter(
        client.id,
        msg.request_id,
        deadline,
        msg.lease_id,
        tuple(msg.names),
        msg.count,
        msg.lease_timeout,
    )
    for name in msg.names:
        pool = pools.get(name)
        if pool is None:
            pool = pools[name] = LeasePool(capacity)
        pool.queue.append(waiter)
    settle(state, msg.kind, waiter.names)
    if msg.lease_id in book.leases:
        return  # granted at once
    if msg.timeout == 0:
        withdraw(state, msg.kind, [waiter], answer=True)
    else:
        book.due(deadline)


def _release(state: SchedulerState, client: ClientRecord, msg: LeaseRequest) -> None:
    lease = state.coordination.leases.get(msg.lease_id)
    # A multi-lock names all its names; its lease may hold only ``count`` of them.
    if lease is None or lease.kind != msg.kind or not set(msg.names) & set(lease.names):
        text = (
            f"no lease {msg.lease_id!r} is held on {msg.kind} {', '.join(map(repr, msg.names))}: "
            "it was never "
            "granted, was released already, or expired (not refreshed within its lease timeout)"
        )
        _answer(state, client.id, msg.request_id, error=text)
        return
    if lease.client_id != client.id:
        text = (
            f"lease {msg.lease_id!r} on {', '.join(map(repr, msg.names))} is held by another client"
        )
        _answer(state, client.id, msg.request_id, error=text)
        return
    end(state, lease)
    _answer(state, client.id, msg.request_id, ok=1)


def refresh(state: SchedulerState, client: ClientRecord, msg: RefreshLeases) -> None:
    """The holder is alive: its leases start their lease timeout again.

    Leases not held (any more) are skipped: one that expired was said to its holder.
    """
    for lease_id in msg.lease_ids:
        lease = state.coordination.leases.get(lease_id)
        if lease is not None and lease.client_id == client.id:
            lease.refreshed = state.now


# --- granting -------------------------------------------------------------------------


def settle(state: SchedulerState, kind: str, names: tuple[str, ...] | list[str]) -> None:
    """Grant every waiter that can be granted now, on these names and, in turn, on the
    names of the waiters granted or gone (their queues' heads changed)."""
    pools = state.coordination.pools[kind]
    todo = list(names)
    while todo:
        name = todo.pop()
        pool = pools.get(name)
        while pool is not None and pool.queue:
            waiter = pool.queue[0]
            chosen = _grantable(pools, waiter)
            if chosen is None:
                break
            _grant(state, kind, waiter, chosen)
            todo.extend(n for n in waiter.names if n != name)
        if pool is not None and not pool.queue and not pool.holders:
            del pools[name]


def _grantable(pools: dict[str, LeasePool], waiter: LeaseWaiter) -> tuple[str, ...] | None:
    """The names ``waiter`` takes now: the first ``count`` of those whose queue it
    heads with a lease free; None while it has fewer."""
    ready = [n for n in waiter.names if pools[n].queue[0] is waiter and pools[n].free > 0]
    return tuple(ready[: waiter.count]) if len(ready) >= waiter.count else None


def _grant(state: SchedulerState, kind: str, waiter: LeaseWaiter, chosen: tuple[str, ...]) -> None:
    book = state.coordination
    pools = book.pools[kind]
    lease = Lease(waiter.lease_id, kind, waiter.client_id, chosen, waiter.lease_timeout, state.now)
    for name in waiter.names:
        pools[name].queue.remove(waiter)
    for name in chosen:
        pools[name].holders[lease.lease_id] = lease
    book.leases[lease.lease_id] = lease
    book.due(lease.expires)
    _answer(state, waiter.client_id, waiter.request_id, ok=1)


def withdraw(state: SchedulerState, kind: str, waiters: list[LeaseWaiter], answer: bool) -> None:
    """Take these waiters out of their queues (answered "not granted" if ``answer``);
    then those behind them may be granted. All are out before any grant, so none of
    them is granted on the way."""
    pools = state.coordination.pools[kind]
    names: set[str] = set()
    for waiter in waiters:
        for name in waiter.names:
            pools[name].queue.remove(waiter)
        names.update(waiter.names)
        if answer:
            _answer(state, waiter.client_id, waiter.request_id, ok=0)
    settle(state, kind, sorted(names))


def end(state: SchedulerState, lease: Lease) -> None:
    """The lease is over: its names go to the next in line."""
    book = state.coordination
    del book.leases[lease.lease_id]
    pools = book.pools[lease.kind]
    for name in lease.names:
        del pools[name].holders[lease.lease_id]
    settle(state, lease.kind, lease.names)


# --- time and departures --------------------------------------------------------------


def expire(state: SchedulerState) -> float:
    """Answer the acquires past their deadline, end the leases past their lease
    timeout; return when the next of either is due."""
    book = state.coordination
    now = state.now
    for lease in [lease for lease in book.leases.values() if lease.expires <= now]:
        text = (
            f"the lease on {lease.kind} {', '.join(map(repr, lease.names))} expired: not "
            f"refreshed for {now - lease.refreshed:.1f}s (lease timeout "
            f"{lease.lease_timeout:g}s); others may hold it now"
        )
        state.warn(f"client {lease.client_id}: {text}")
        state.emit(SendNotice(lease.client_id, "warning", text))
        end(state, lease)
    for kind in book.pools:
        withdraw(state, kind, _waiters(state, kind, lambda w: w.deadline <= now), answer=True)
    return min(_deadlines(state), default=math.inf)


def _deadlines(state: SchedulerState) -> list[float]:
    book = state.coordination
    due = [lease.expires for lease in book.leases.values()]
    due += [w.deadline for pools in book.pools.values() for p in pools.values() for w in p.queue]
    return due


def client_left(state: SchedulerState, client_id: str) -> None:
    """A client left (or crashed): its acquires stop waiting, its leases end (in that
    order: a lease it gives back must not go to its own waiter)."""
    book = state.coordination
    for kind in book.pools:
        mine = _waiters(state, kind, lambda w: w.client_id == client_id)
        withdraw(state, kind, mine, answer=False)
    for lease in [lease for lease in book.leases.values() if lease.client_id == client_id]:
        end(state, lease)


def _waiters(
    state: SchedulerState, kind: str, which: Callable[[LeaseWaiter], bool]
) -> list[LeaseWaiter]:
    """The waiters of ``kind`` for which ``which`` holds, each once."""
    found: dict[int, LeaseWaiter] = {}
    for pool in state.coordination.pools[kind].values():
        for waiter in pool.queue:
            if which(waiter):
                found.setdefault(id(waiter), waiter)
    return list(found.values())
