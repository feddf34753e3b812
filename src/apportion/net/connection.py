"""A framed, batching connection over a ``Stream``.

``send`` never blocks: it appends to an outbox that is flushed as one frame at the
end of the current loop turn, so a burst of messages to one peer costs one write
and one frame. ``recv`` returns the messages of one frame, each payload's buffers
received straight into memory of their own.

Between two processes of one machine a connection may *lend* its large buffers
instead of sending them (``net/lending.py``): the receiver reads them from the
sender's memory. The two control messages this takes, ``LendBuffers`` and
``BuffersReturned``, are handled here and never reach the connection's owner.

A service facing untrusted peers bounds what one of them can hold: ``limit_unsent``
drops a peer that reads nothing, and ``stall_timeout`` one that stops half-way
through a frame (``net/stream.py``); ``max_frame`` and the codec's limits refuse a
frame too large before anything of its size is allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from apportion.net import lending
from apportion.net.receive_pool import POOL, POOL_FROM
from apportion.net.stream import Buffer, Stream, StreamClosed, StreamStalled
from apportion.protocol.base import Message
from apportion.protocol.codec import (
    BUFFER_LENGTH,
    HEADER,
    LENT_PLACE,
    MAX_FRAME,
    ProtocolError,
    buffer_lengths,
    decode_body,
    encode_frame,
    frame_sizes,
)
from apportion.protocol.handshake import BuffersReturned, LendBuffers

logger = logging.getLogger("apportion.net")


class ConnectionClosed(Exception):
    """The peer went away (or we closed the connection)."""


def receive_buffer(size: int) -> memoryview:
    """Writable memory for ``size`` received bytes; a value rebuilt from it keeps it
    (a NumPy array over it, or the ``bytearray`` itself).

    A ``bytearray`` is zeroed byte by byte first, a second pass over every byte
    received; large buffers (``POOL_FROM`` or more) are not: they come from the
    process's ``receive_pool``, which reuses the memory of buffers no longer used
    while its pages are still in place.
    """
    try:
        if size < POOL_FROM:
            return memoryview(bytearray(size))
        return POOL.take(size)
    except (MemoryError, OSError) as exc:
        raise ProtocolError(f"cannot hold a buffer of {size:,} bytes: {exc}") from None


#: Lent buffers of this many bytes or more are read in a thread, not on the loop.
READ_IN_THREAD_FROM = 4 << 20


def lent_to(lent: list[Buffer], from_bytes: int) -> Callable[[Buffer, int], int | None]:
    """``encode_frame``'s ``lend``: buffers of ``from_bytes`` or more are lent, and
    kept in ``lent`` until the peer returns them."""

    def lend(buffer: Buffer, size: int) -> int | None:
        if size < from_bytes:
            return None
        lent.append(buffer)
        return lending.address_of(buffer)

    return lend


@dataclass(frozen=True, slots=True)
class FrameHead:
    """A received frame up to its buffers, which are still to be read from the stream."""

    header: bytes
    listed: bytes  #: the buffers' lengths as they came
    body: bytes | bytearray
    lengths: list[int]
    #: Indices of the buffers lent rather than sent (their addresses follow instead).
    lent: tuple[int, ...] = ()

    @property
    def raw(self) -> list[Buffer]:
        """The head as it was received, to forward the frame as it is."""
        return [self.header, self.listed, self.body]


class Connection:
    """One peer. Not thread-safe: use it from its event loop only."""

    def __init__(self, stream: Stream, *, max_frame: int = MAX_FRAME) -> None:
        self._stream = stream
        self._outbox: list[Message] = []
        #: Set while a frame is written piece by piece (``exclusive``): messages sent
        #: meanwhile wait in the outbox, and then leave in order.
        self._held = False
        self._hold = asyncio.Lock()
        #: Frame limit for ``recv``; raised from the handshake limit once authenticated.
        self.max_frame = max_frame
        self.peer = stream.peer
        #: Lending this side's buffers: whether the peer may ask (this side offered),
        #: from which size it asked, and the buffers of each lending frame it has not
        #: returned yet, oldest first.
        self._may_lend = False
        self._lend_from: int | None = None
        self._lent: deque[list[Buffer]] = deque()
        #: The pid of the peer whose lent buffers this side reads (``borrow_from``).
        self._lender: int | None = None

    @property
    def closed(self) -> bool:
        return self._stream.closed

    def limit_unsent(self, n: int | None) -> None:
        """Abort the connection when a send finds more than ``n`` bytes still unsent
        (the peer reads nothing); None: no bound. ``stream.MAX_UNSENT`` is the usual
        bound for a service."""
        self._stream.max_unsent = n

    @property
    def stall_timeout(self) -> float | None:
        """Seconds the peer may pause in the middle of a frame before ``recv`` fails
        with ``ProtocolError`` (None: for ever). Between frames it may be idle for as
        long as it likes. ``stream.STALL_TIMEOUT`` is the usual value for a service."""
        return self._stream.stall_timeout

    @stall_timeout.setter
    def stall_timeout(self, seconds: float | None) -> None:
        self._stream.stall_timeout = seconds

    def send(self, message: Message) -> None:
        """Queue ``message``; everything queued in this loop turn leaves as one frame."""
        if self._stream.closed:
            return
        if not self._outbox and not self._held:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        if self._held:
            return  # ``exclusive`` flushes when it ends
        if self._stream.closed or not self._outbox:
            self._outbox.clear()
            return
        batch, self._outbox = self._outbox, []
        lent: list[Buffer] | None = None
        try:
            if self._lend_from is None:
                frame = encode_frame(batch)
            else:
                lent = []
                frame = encode_frame(batch, lent_to(lent, self._lend_from))
        except (ProtocolError, TypeError, ValueError, OverflowError) as exc:
            # Runs from call_soon, where an exception would vanish: say so, and close,
            # so the peer and our reader both see the failure instead of a silent gap.
            logger.error("cannot send %d messages to %s: %s; closing", len(batch), self.peer, exc)
            self.abort()
            return
        if lent:
            self._lent.append(lent)
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
        head = await self.recv_head()
        buffers = []
        for i, length in enumerate(head.lengths):
            buffer = receive_buffer(length)
            if i in head.lent:
                await self._read_lent(buffer)
            else:
                await self.read_into(buffer)
            buffers.append(buffer)
        if head.lent:
            self.send(BuffersReturned(1))
        messages = decode_body(head.body, buffers)
        if self._may_lend:
            messages = [m for m in messages if not self._lending_control(m)]
        return messages

    # --- lending (``net/lending.py``) ---------------------------------------------------

    @property
    def lent_frames(self) -> int:
        """Frames whose lent buffers the peer has not returned yet."""
        return len(self._lent)

    def offer_lending(self) -> None:
        """Let the peer ask for lent buffers (this side's ``Welcome`` offered its probe)."""
        self._may_lend = True

    def borrow_from(self, pid: int) -> None:
        """Read buffers lent by the peer, process ``pid``, and ask it to lend them."""
        self._lender = pid
        self.send(LendBuffers(lending.LEND_FROM))

    def _lending_control(self, message: Message) -> bool:
        """Apply ``message`` if it is about lending; True if it was."""
        if isinstance(message, LendBuffers):
            self._lend_from = max(1, message.from_bytes)
            return True
        if isinstance(message, BuffersReturned):
            if not 0 < message.frames <= len(self._lent):
                raise ProtocolError(
                    f"the peer returned {message.frames} lending frames of {len(self._lent)}"
                )
            for _ in range(message.frames):
                self._lent.popleft()
            return True
        return False

    async def _read_lent(self, into: memoryview) -> None:
        """Fill ``into`` from the lender's memory, at the address the stream holds next."""
        if self._lender is None:
            raise ProtocolError(f"{self.peer} lent a buffer it was not asked to lend")
        try:
            (address,) = LENT_PLACE.unpack(await self._stream.read_exactly(LENT_PLACE.size))
        except StreamClosed as exc:
            raise self._closed_by(exc) from exc
        except StreamStalled as exc:
            raise self._stalled(exc) from None
        try:
            if len(into) >= READ_IN_THREAD_FROM:
                # A copy of many MiB would stall every other connection of this loop.
                await asyncio.to_thread(lending.read_lent, self._lender, address, into)
            else:
                lending.read_lent(self._lender, address, into)
        except OSError as exc:
            raise ProtocolError(f"cannot read a buffer lent by {self.peer}: {exc}") from None

    async def recv_head(self) -> FrameHead:
        """The next frame's header, buffer lengths and body, checked against
        ``max_frame``; its buffers follow, for ``read_into``."""
        stream = self._stream
        try:
            # Each part taken at once when it is here (most frames arrive whole),
            # else waited for.
            header = stream.take_now(HEADER.size)
            if header is None:
                if stream.stall_timeout is not None:
                    await stream.readable()  # idle between frames is no stall
                header = bytes(await stream.read_exactly(HEADER.size))
            body_size, count = frame_sizes(header, self.max_frame)
            listed = b""
            lengths: list[int] = []
            lent: tuple[int, ...] = ()
            if count:
                size = count * BUFFER_LENGTH.size
                listed = stream.take_now(size) or bytes(await stream.read_exactly(size))
                lengths, lent = buffer_lengths(listed, count, body_size, self.max_frame)
            body: bytes | bytearray | None = stream.take_now(body_size)
            if body is None:
                body = await stream.read_exactly(body_size)
        except StreamClosed as exc:
            raise self._closed_by(exc) from exc
        except StreamStalled as exc:
            raise self._stalled(exc) from None
        return FrameHead(header, listed, body, lengths, lent)

    async def read_into(self, view: memoryview) -> None:
        """Fill ``view`` with the next bytes of the frame being received."""
        try:
            await self._stream.read_into(view)
        except StreamClosed as exc:
            raise self._closed_by(exc) from exc
        except StreamStalled as exc:
            raise self._stalled(exc) from None

    def _closed_by(self, exc: StreamClosed) -> ConnectionClosed:
        self.abort()  # the peer is gone: release the socket now, not at GC
        return ConnectionClosed(f"connection to {self.peer} closed")

    def _stalled(self, exc: StreamStalled) -> ProtocolError:
        # The rest of the frame may still come, but its place in the stream is lost:
        # nothing after it could be read, so the connection is of no further use.
        self.abort()
        return ProtocolError(f"{self.peer} stalled in the middle of a frame for {exc.seconds:g} s")

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Own the outgoing side, to write one frame in pieces with ``write_raw``:
        what was sent before goes first, what is sent meanwhile waits until the end."""
        async with self._hold:
            self._flush()
            self._held = True
            try:
                yield
            finally:
                self._held = False
                self._flush()

    def write_raw(self, buffers: Sequence[Buffer]) -> None:
        """Write bytes as they are (part of a frame), inside ``exclusive``."""
        assert self._held, "write_raw belongs inside exclusive()"
        self._stream.write(buffers)

    async def close(self) -> None:
        """Flush what is queued and close; safe to call twice."""
        if self._stream.closed:
            return
        self._flush()
        with contextlib.suppress(ConnectionError):
            await self._stream.close()
        self._lent.clear()

    def abort(self) -> None:
        """Close at once without flushing (used on protocol errors)."""
        self._outbox.clear()
        self._lent.clear()
        self._stream.abort()
