"""How results reach the client and scattered data the workers: direct or relayed.

A large value should cross the network once, straight between the client and the
worker, never through the scheduler (whose memory every client shares and whose
loss stops everything). A small one is cheaper through the scheduler: one round
trip instead of two. ``direct_to_workers`` chooses:

- ``None`` (the default): results of ``DIRECT_FROM`` bytes or more are fetched from
  the workers holding them, the rest relayed in the same round trip; scattered data
  of that size goes to the workers' data ports. A worker that cannot be reached
  within ``DIRECT_CONNECT_TIMEOUT`` (a client on a login node that sees only the
  scheduler) is remembered, and its data relayed by the scheduler instead.
- ``True``: everything direct; an unreachable worker is an error.
- ``False``: everything through the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from apportion.core.payload import Pickled, size_of
from apportion.protocol.cluster import InfoRequest
from apportion.protocol.peer_data import GetData, PutData
from apportion.protocol.tasks import GatherRequest, ScatterPlaced, WhoHasRequest
from apportion.scheduler.records import worker_aliases

if TYPE_CHECKING:
    from apportion.client.session import Session
    from apportion.net.connection import Connection

#: Results and scattered data of this many bytes or more go straight between client
#: and workers where the workers can be reached.
DIRECT_FROM = 1 << 20
#: Seconds to reach a worker's data port before leaving its data to the scheduler.
DIRECT_CONNECT_TIMEOUT = 3.0


class Fetched:
    """Pickled results fetched, keys missing, unsendable ones, and keys to relay."""

    __slots__ = ("data", "errors", "missing", "relay")

    def __init__(
        self, data: dict[str, Pickled], missing: list[str], errors: dict[str, str]
    ) -> None:
        self.data = data
        self.missing = missing
        self.errors = errors
        #: Keys whose holders cannot be reached from here: for the scheduler to relay.
        self.relay: list[str] = []

    def merge(self, other: Fetched) -> None:
        self.data.update(other.data)
        self.missing.extend(other.missing)
        self.errors.update(other.errors)
        self.relay.extend(other.relay)

    def __iter__(self) -> Iterator[Any]:
        """``data, missing, errors = fetched``."""
        return iter((self.data, self.missing, self.errors))


async def fetch(session: Session, keys: list[str], direct: bool | None) -> Fetched:
    """The pickled results of ``keys``, and those missing or unsendable (see the
    module docstring for ``direct``)."""
    if direct:
        where = await session.request(WhoHasRequest(session.next_id(), keys))
        fetched = await _from_holders(session, where.who_has, strict=True)
        fetched.missing.extend(key for key in keys if key not in where.who_has)
        return fetched
    direct_from = DIRECT_FROM if direct is None else 0
    fetched = await _gather(session, keys, direct_from)
    if fetched.relay:
        relay, fetched.relay = fetched.relay, []
        fetched.merge(await _gather(session, relay, 0))
    return fetched


async def _gather(session: Session, keys: list[str], direct_from: int) -> Fetched:
    """A ``GatherRequest``: what the scheduler relayed, with the large results it
    forwarded ahead of its reply, and those fetched from their holders (left in
    ``relay`` when unreachable)."""
    reply = await session.request(GatherRequest(session.next_id(), keys, direct_from))
    fetched = Fetched(dict(reply.data), list(reply.missing), dict(reply.errors))
    for part in session.take_parts(reply.request_id):
        fetched.merge(Fetched(dict(part.data), list(part.missing), dict(part.errors)))
    for key in reply.missing:  # forwarded in part only: its worker went away meanwhile
        fetched.data.pop(key, None)
    if reply.elsewhere:
        fetched.merge(await _from_holders(session, reply.elsewhere, strict=False))
    return fetched


async def _from_holders(
    session: Session, who_has: dict[str, list[str]], *, strict: bool
) -> Fetched:
    """Fetch each key from a holder, one request per worker, all at once. Keys whose
    holders cannot be reached are left to relay (``strict``: ``OSError``)."""
    fetched = Fetched({}, [], {})
    unreached = fetched.missing if strict else fetched.relay
    by_address: dict[str, list[str]] = {}
    for key, addresses in who_has.items():
        reachable = [a for a in addresses if a not in session.unreachable]
        if reachable:
            by_address.setdefault(reachable[0], []).append(key)
        else:
            unreached.append(key)

    async def from_one(address: str, some: list[str]) -> None:
        conn = await _reach(session, address, strict=strict)
        if conn is None:
            unreached.extend(some)
            return
        try:
            data = await session.request(GetData(session.next_id(), some), conn)
        except OSError:
            fetched.missing.extend(some)  # the worker went away: like a result it lost
            return
        fetched.merge(Fetched(data.data, data.missing, data.errors))

    await asyncio.gather(*(from_one(a, some) for a, some in by_address.items()))
    return fetched


async def _reach(session: Session, address: str, *, strict: bool) -> Connection | None:
    """The data connection to ``address``; None, remembered, if it cannot be reached
    in ``DIRECT_CONNECT_TIMEOUT`` (``strict``: ``OSError`` within the client's timeout)."""
    try:
        return await session.peer(address, None if strict else DIRECT_CONNECT_TIMEOUT)
    except OSError:
        if strict:
            raise
        session.unreachable.add(address)
        return None


async def scatter_direct(
    session: Session, items: dict[str, Pickled], allowed: list[str], *, strict: bool
) -> dict[str, Pickled]:
    """Put data on workers' data ports, fewest stored bytes first, then tell the
    scheduler; return what is left for the scheduler to relay: what no reachable worker
    took, everything when none can be reached. ``strict`` raises instead."""
    info = await session.request(InfoRequest(session.next_id()))
    workers = sorted(
        (
            (address, w)
            for address, w in info.info["workers"].items()
            if address not in session.unreachable
            and (not allowed or worker_aliases(w["name"], address) & set(allowed))
        ),
        key=lambda kv: kv[1]["nbytes"],
    )
    if not workers:
        if not strict:
            return items  # the scheduler waits for a worker, or says none will come
        where = f" matching {allowed}" if allowed else ""
        raise RuntimeError(f"no workers{where} are connected to scatter data to")
    parts: dict[str, dict[str, Pickled]] = {}
    for i, (key, blob) in enumerate(items.items()):
        parts.setdefault(workers[i % len(workers)][0], {})[key] = blob
    placed: dict[str, list[Any]] = {}
    left: dict[str, Pickled] = {}
    for address, part in parts.items():
        conn = await _reach(session, address, strict=strict)
        if conn is None:
            left.update(part)
            continue
        stored = await session.request(PutData(session.next_id(), part), conn)
        for key in stored.keys:
            placed[key] = [address, stored.nbytes.get(key, size_of(part[key]))]
    if placed:
        await session.request(ScatterPlaced(session.next_id(), placed))
    return left
