"""Forwarding a frame's buffers from one connection to another through a bounded buffer.

The scheduler relays a large result from a worker to a client that cannot reach the
worker (a login node). Received whole, the value would cost the scheduler its size
once per fetch, and several clients fetching at once would multiply it; the
scheduler is the one process whose loss stops everything. Forwarded piece by piece,
it costs two chunks per relay, whatever the value's size: a chunk is read from the
source while the other may still be leaving through the sink.
"""

from __future__ import annotations

from apportion.net.connection import Connection, ConnectionClosed

#: Bytes read from the source before they are written to the sink.
PIPE_CHUNK = 1 << 20


async def forward_buffers(
    source: Connection, sink: Connection, lengths: list[int], chunk: int = PIPE_CHUNK
) -> bool:
    """Copy the next ``sum(lengths)`` bytes of ``source`` onto ``sink`` (held with
    ``sink.exclusive()``, the frame's head already written). True if they all came;
    if ``source`` ends first, zeros stand in for the rest, so that the frame the sink
    receives stays whole, and the answer is False. ``ConnectionClosed`` if ``sink``
    goes away."""
    total = sum(lengths)
    size = min(chunk, total)
    # Two buffers in turn: once ``drain`` returns, at most the tail of the last chunk
    # waits to be sent, so the other buffer has left and may be filled again.
    buffers = (memoryview(bytearray(size)), memoryview(bytearray(size)))
    zeros: memoryview | None = None
    sent, turn = 0, 0
    while sent < total:
        n = min(size, total - sent)
        view = buffers[turn][:n]
        if zeros is None:
            try:
                await source.read_into(view)
            except ConnectionClosed:
                zeros = memoryview(bytes(size))
        if zeros is not None:
            view = zeros[:n]
        sink.write_raw([view])
        await sink.drain()
        sent += n
        turn ^= 1
    return zeros is None
