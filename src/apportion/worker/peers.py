"""Fetching data from other workers: one connection per peer, reused for every request.

Answers are matched to requests by ``request_id``, so several fetches to one peer
can be in flight at once on its single connection, and the connection's own
batching turns the fetches of one loop turn into one frame. A peer answers in parts
(``GetData.in_parts``): the small values first, then each large one alone, and each
part is handed on as it arrives, so a task whose input came first starts while the
others are still on their way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable

from apportion.core.payload import size_of
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import open_connection
from apportion.net.security import Security
from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError
from apportion.protocol.peer_data import DataReply, GetData

logger = logging.getLogger("apportion.worker")


class Receiving:
    """One request's answer, coming in parts until every key asked is accounted for."""

    def __init__(self, keys: list[str], on_part: Callable[[DataReply], None]) -> None:
        self.remaining = set(keys)
        self.on_part = on_part
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def take(self, part: DataReply) -> bool:
        """Hand ``part`` on; True once nothing more is to come."""
        self.remaining.difference_update(part.data, part.missing, part.errors)
        self.on_part(part)
        return not self.remaining


class PeerChannel:
    """The connection to one peer and the requests waiting for its answers."""

    def __init__(self, address: str, conn: Connection, pool: PeerPool) -> None:
        self.address = address
        self.conn = conn
        self._pool = pool
        #: request_id -> its answer so far; emptied with an error when the peer goes.
        self.pending: dict[int, Receiving] = {}
        self.reader = asyncio.create_task(self._read(), name=f"peer-reader-{address}")

    @property
    def alive(self) -> bool:
        return not self.conn.closed and not self.reader.done()

    async def _read(self) -> None:
        error: Exception = ConnectionClosed(f"connection to peer {self.address} closed")
        try:
            while True:
                # Handed on in a call of its own: a local of this coroutine would keep
                # the last answer, and the memory its values arrived in, alive for as
                # long as the peer has nothing more to send.
                self._hand_on(await self.conn.recv())
        except (ConnectionClosed, ProtocolError) as exc:
            error = exc
            logger.info("connection to peer %s ended: %s", self.address, exc)
        finally:
            self.conn.abort()
            for receiving in self.pending.values():
                if not receiving.done.done():
                    receiving.done.set_exception(ConnectionClosed(str(error)))
            self.pending.clear()

    def _hand_on(self, messages: list[Message]) -> None:
        """Give each part of an answer to the request waiting for it."""
        for message in messages:
            if not isinstance(message, DataReply):
                raise ProtocolError(f"peer sent {type(message).__name__}, not DataReply")
            if message.data:
                # Counted as they arrive, answers nobody waits for any more too.
                self._pool.received += sum(map(size_of, message.data.values()))
            receiving = self.pending.get(message.request_id)
            if receiving is not None and receiving.take(message):
                del self.pending[message.request_id]
                if not receiving.done.done():
                    receiving.done.set_result(None)


class PeerPool:
    """Connections to peers by data address, opened on first use."""

    def __init__(self, name: str, security: Security) -> None:
        self._name = name
        self._security = security
        self._channels: dict[str, PeerChannel] = {}
        self._opening: dict[str, asyncio.Task[PeerChannel]] = {}
        self._ids = itertools.count(1)
        #: Bytes of results received from peers since this pool was made (their
        #: pickled size on the wire, frames' lengths, as ``size_of`` reads them).
        self.received = 0

    async def get_data(
        self, address: str, keys: Iterable[str], on_part: Callable[[DataReply], None]
    ) -> None:
        """Ask ``address`` for ``keys``, handing each part of the answer to ``on_part``
        as it arrives; return once every key came (held, missing or unsendable).
        Raises ``OSError`` or ``ConnectionClosed`` (some parts may have come)."""
        channel = await self._channel(address)
        request_id = next(self._ids)
        asked = list(keys)
        receiving = channel.pending[request_id] = Receiving(asked, on_part)
        channel.conn.send(GetData(request_id, asked, in_parts=True))
        await receiving.done

    async def _channel(self, address: str) -> PeerChannel:
        channel = self._channels.get(address)
        if channel is not None and channel.alive:
            return channel
        opening = self._opening.get(address)
        if opening is None:
            opening = asyncio.create_task(self._open(address), name=f"peer-open-{address}")
            self._opening[address] = opening
        return await asyncio.shield(opening)

    async def _open(self, address: str) -> PeerChannel:
        try:
            conn, _ = await open_connection(
                address, "peer", self._name, security=self._security, borrow=True
            )
            channel = self._channels[address] = PeerChannel(address, conn, self)
            return channel
        finally:
            del self._opening[address]

    async def close(self) -> None:
        """Close every peer connection; waiting fetches fail with ``ConnectionClosed``."""
        for task in list(self._opening.values()):
            task.cancel()
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.reader.cancel()
            await channel.conn.close()
        for channel in channels:
            with contextlib.suppress(asyncio.CancelledError):
                await channel.reader
