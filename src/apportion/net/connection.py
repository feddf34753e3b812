"""A framed, batching connection over asyncio streams.

``send`` never blocks: it appends to an outbox that is flushed as one frame at the
end of the current loop turn, so a burst of messages to one peer costs one write
and one frame. ``recv`` returns the messages of one frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from apportion.protocol.codec import (
    HEADER,
    MAX_FRAME,
    ProtocolError,
    decode_body,
    encode_frame,
    frame_length,
)
from apportion.protocol.messages import Message

logger = logging.getLogger("apportion.net")


def _frames(batch: list[Message]) -> list[bytes]:
    """``batch`` as one frame, or as several in order when together they are too big
    (each message fits alone: senders check their payloads against the limit)."""
    try:
        return [encode_frame(batch)]
    except ProtocolError:
        if len(batch) == 1:
            raise
    half = len(batch) // 2
    return _frames(batch[:half]) + _frames(batch[half:])


class ConnectionClosed(Exception):
    """The peer went away (or we closed the connection)."""


class Connection:
    """One peer. Not thread-safe: use it from its event loop only."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._outbox: list[Message] = []
        self._closed = False
        #: Frame limit for ``recv``; raised from the handshake limit once authenticated.
        self.max_frame = max_frame
        peer: Any = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, message: Message) -> None:
        """Queue ``message``; everything queued in this loop turn leaves as one frame."""
        if self._closed:
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        if self._closed or not self._outbox:
            self._outbox.clear()
            return
        batch, self._outbox = self._outbox, []
        try:
            frames = _frames(batch)
        except (ProtocolError, TypeError, ValueError, OverflowError) as exc:
            # Runs from call_soon, where an exception would vanish: say so, and close,
            # so the peer and our reader both see the failure instead of a silent gap.
            logger.error("cannot send %d messages to %s: %s; closing", len(batch), self.peer, exc)
            self.abort()
            return
        for frame in frames:
            self._writer.write(frame)

    async def drain(self) -> None:
        """Wait until the transport's buffer is low again (for bulk senders)."""
        self._flush()
        if not self._closed:
            try:
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                raise ConnectionClosed(str(exc)) from None

    async def recv(self) -> list[Message]:
        """The messages of the next frame. Raises ``ConnectionClosed`` or ``ProtocolError``."""
        try:
            header = await self._reader.readexactly(HEADER.size)
            body = await self._reader.readexactly(frame_length(header, self.max_frame))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.abort()  # the peer is gone: release the transport now, not at GC
            raise ConnectionClosed(f"connection to {self.peer} closed") from exc
        return decode_body(body)

    async def close(self) -> None:
        """Flush what is queued and close; safe to call twice."""
        if self._closed:
            return
        self._flush()
        self._closed = True
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.close()
            await self._writer.wait_closed()

    def abort(self) -> None:
        """Close at once without flushing (used on protocol errors)."""
        self._closed = True
        self._outbox.clear()
        self._writer.transport.abort()
