"""Fetching data from other workers: one connection per peer, reused for every request.

Answers are matched to requests by ``request_id``, so several fetches to one peer
can be in flight at once on its single connection, and the connection's own
batching turns the fetches of one loop turn into one frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Iterable

from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import open_connection
from apportion.protocol.codec import ProtocolError
from apportion.protocol.messages import DataReply, GetData

logger = logging.getLogger("apportion.worker")


class PeerChannel:
    """The connection to one peer and the requests waiting for its answers."""

    def __init__(self, address: str, conn: Connection) -> None:
        self.address = address
        self.conn = conn
        #: request_id -> future of its reply; emptied with an error when the peer goes.
        self.pending: dict[int, asyncio.Future[DataReply]] = {}
        self.reader = asyncio.create_task(self._read(), name=f"peer-reader-{address}")

    @property
    def alive(self) -> bool:
        return not self.conn.closed and not self.reader.done()

    async def _read(self) -> None:
        error: Exception = ConnectionClosed(f"connection to peer {self.address} closed")
        try:
            while True:
                for message in await self.conn.recv():
                    if not isinstance(message, DataReply):
                        raise ProtocolError(f"peer sent {type(message).__name__}, not DataReply")
                    future = self.pending.pop(message.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(message)
        except (ConnectionClosed, ProtocolError) as exc:
            error = exc
            logger.info("connection to peer %s ended: %s", self.address, exc)
        finally:
            self.conn.abort()
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(ConnectionClosed(str(error)))
            self.pending.clear()


class PeerPool:
    """Connections to peers by data address, opened on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._channels: dict[str, PeerChannel] = {}
        self._opening: dict[str, asyncio.Task[PeerChannel]] = {}
        self._ids = itertools.count(1)

    async def get_data(self, address: str, keys: Iterable[str]) -> DataReply:
        """Ask ``address`` for ``keys``. Raises ``OSError`` or ``ConnectionClosed``."""
        channel = await self._channel(address)
        request_id = next(self._ids)
        future: asyncio.Future[DataReply] = asyncio.get_running_loop().create_future()
        channel.pending[request_id] = future
        channel.conn.send(GetData(request_id, list(keys)))
        return await future

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
            conn, _ = await open_connection(address, "peer", self._name)
            channel = self._channels[address] = PeerChannel(address, conn)
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
