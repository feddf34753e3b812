"""A framed, batching connection over a ``Stream``.

``send`` never blocks: it appends to an outbox that is flushed as one frame at the
end of the current loop turn, so a burst of messages to one peer costs one write
and one frame. ``recv`` returns the messages of one frame, each payload's buffers
received straight into memory of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import sys

from apportion.net.stream import Stream, StreamClosed
from apportion.protocol.codec import (
    BUFFER_LENGTH,
    HEADER,
    MAX_FRAME,
    ProtocolError,
    buffer_lengths,
    decode_body,
    encode_frame,
    frame_sizes,
)
from apportion.protocol.messages import Message

logger = logging.getLogger("apportion.net")


class ConnectionClosed(Exception):
    """The peer went away (or we closed the connection)."""


#: Buffers from this size up are not zeroed before the socket fills them.
UNZEROED_FROM = 1 << 20
#: Linux's advice that a mapping be backed by huge pages where it can (None elsewhere):
#: a 2 MiB page faults in once where 4 KiB pages would fault 512 times.
HUGE_PAGES: int | None = getattr(mmap, "MADV_HUGEPAGE", None)


def receive_buffer(size: int) -> memoryview:
    """Writable memory for ``size`` received bytes; a value rebuilt from it keeps it
    (a NumPy array over it, or the ``bytearray`` itself).

    A ``bytearray`` is zeroed byte by byte first, a second pass over every byte
    received; large buffers are not. Where NumPy is loaded (where large arrays
    travel) they are ``numpy.empty`` arrays: the allocator reuses memory already
    paged in, and advises huge pages for large ones. Otherwise they are anonymous
    memory maps whose pages the kernel hands out as the socket writes them.
    """
    try:
        if size < UNZEROED_FROM:
            return memoryview(bytearray(size))
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            return memoryview(numpy.empty(size, numpy.uint8))
        mapped = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if HUGE_PAGES is not None:
            mapped.madvise(HUGE_PAGES)
        return memoryview(mapped)
    except (MemoryError, OSError) as exc:
        raise ProtocolError(f"cannot hold a buffer of {size:,} bytes: {exc}") from None


class Connection:
    """One peer. Not thread-safe: use it from its event loop only."""

    def __init__(self, stream: Stream, *, max_frame: int = MAX_FRAME) -> None:
        self._stream = stream
        self._outbox: list[Message] = []
        #: Frame limit for ``recv``; raised from the handshake limit once authenticated.
        self.max_frame = max_frame
        self.peer = stream.peer

    @property
    def closed(self) -> bool:
        return self._stream.closed

    def send(self, message: Message) -> None:
        """Queue ``message``; everything queued in this loop turn leaves as one frame."""
        if self._stream.closed:
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        if self._stream.closed or not self._outbox:
            self._outbox.clear()
            return
        batch, self._outbox = self._outbox, []
        try:
            frame = encode_frame(batch)
        except (ProtocolError, TypeError, ValueError, OverflowError) as exc:
            # Runs from call_soon, where an exception would vanish: say so, and close,
            # so the peer and our reader both see the failure instead of a silent gap.
            logger.error("cannot send %d messages to %s: %s; closing", len(batch), self.peer, exc)
            self.abort()
            return
        self._stream.write(frame)

    async def drain(self) -> None:
        """Wait until what was sent has mostly left (for bulk senders)."""
        self._flush()
        try:
            await self._stream.drain()
        except StreamClosed as exc:
            raise ConnectionClosed(str(exc)) from None

    async def recv(self) -> list[Message]:
        """The messages of the next frame. Raises ``ConnectionClosed`` or ``ProtocolError``."""
        stream = self._stream
        try:
            body_size, count = frame_sizes(await stream.read_exactly(HEADER.size), self.max_frame)
            lengths: list[int] = []
            if count:
                listed = await stream.read_exactly(count * BUFFER_LENGTH.size)
                lengths = buffer_lengths(listed, count, body_size, self.max_frame)
            body = await stream.read_exactly(body_size)
            buffers = []
            for length in lengths:
                buffer = receive_buffer(length)
                await stream.read_into(buffer)
                buffers.append(buffer)
        except StreamClosed as exc:
            self.abort()  # the peer is gone: release the socket now, not at GC
            raise ConnectionClosed(f"connection to {self.peer} closed") from exc
        return decode_body(body, buffers)

    async def close(self) -> None:
        """Flush what is queued and close; safe to call twice."""
        if self._stream.closed:
            return
        self._flush()
        with contextlib.suppress(ConnectionError):
            await self._stream.close()

    def abort(self) -> None:
        """Close at once without flushing (used on protocol errors)."""
        self._outbox.clear()
        self._stream.abort()
