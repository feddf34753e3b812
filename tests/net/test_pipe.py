"""A frame forwarded from one connection to another arrives whole and equal, costs
the forwarder a bounded buffer whatever its size, and stays whole for the receiver
when its source goes away mid-way."""

from __future__ import annotations

import asyncio
import socket
import tracemalloc
from typing import Any

import numpy as np
import pytest

from apportion.core.payload import dumps, loads
from apportion.net.connection import Connection
from apportion.net.pipe import PIPE_CHUNK, forward_buffers
from apportion.net.stream import READ_BUFFER, SocketStream
from apportion.protocol.codec import encode_frame
from apportion.protocol.peer_data import DataReply
from apportion.protocol.worker import Heartbeat

pytestmark = pytest.mark.timeout(60)


def _pair(loop: asyncio.AbstractEventLoop) -> tuple[Connection, Connection]:
    left, right = socket.socketpair()
    return Connection(SocketStream(left, loop)), Connection(SocketStream(right, loop))


async def _forward(source: Connection, sink: Connection) -> bool:
    head = await source.recv_head()
    async with sink.exclusive():
        sink.write_raw(head.raw)
        return await forward_buffers(source, sink, head.lengths)


def _run(main: Any) -> Any:
    return asyncio.run(main())


def test_a_forwarded_frame_arrives_equal_and_messages_sent_meanwhile_follow_it() -> None:
    array = np.arange(3 * PIPE_CHUNK // 8 + 5, dtype=np.float64)  # not a whole chunk

    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker, upstream = _pair(loop)
        downstream, client = _pair(loop)
        try:
            worker.send(DataReply(4, {"a": dumps(array), "b": dumps(b"x")}, ["gone"], {}))
            received = asyncio.create_task(client.recv())
            head = await upstream.recv_head()
            async with downstream.exclusive():
                downstream.send(Heartbeat(1, 2))  # waits for the forwarded frame to end
                downstream.write_raw(head.raw)
                assert await forward_buffers(upstream, downstream, head.lengths)
            first, second = await received, await client.recv()
            (reply,) = first
            assert isinstance(reply, DataReply) and reply.missing == ["gone"]
            assert np.array_equal(loads(reply.data["a"]), array)
            assert loads(reply.data["b"]) == b"x"
            assert second == [Heartbeat(1, 2)]
        finally:
            for conn in (worker, upstream, downstream, client):
                conn.abort()

    _run(main)


def test_forwarding_costs_a_bounded_buffer_whatever_the_size() -> None:
    """The traced heap while 64 MiB pass through: the two chunks and the source's read
    buffer, not the value. The sender sends from the array itself and the receiver
    reads into one reused buffer, so neither adds to what is traced."""
    size = 64 * 2**20
    array = np.ones(size, dtype=np.uint8)
    pickled = dumps(array)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        worker, upstream = _pair(loop)
        downstream, client = _pair(loop)
        sink = memoryview(bytearray(PIPE_CHUNK))

        async def drain_client() -> int:
            head = await client.recv_head()
            total = sum(head.lengths)
            got = 0
            while got < total:
                n = min(len(sink), total - got)
                await client.read_into(sink[:n])
                got += n
            return got

        try:
            tracemalloc.start()
            tracemalloc.reset_peak()
            worker.send(DataReply(1, {"a": pickled}, [], {}))
            received = asyncio.create_task(drain_client())
            assert await _forward(upstream, downstream)
            assert await received >= size
            _, peak = tracemalloc.get_traced_memory()
            return peak
        finally:
            tracemalloc.stop()
            for conn in (worker, upstream, downstream, client):
                conn.abort()

    peak = _run(main)
    bound = 2 * PIPE_CHUNK + 2 * READ_BUFFER + 2**20
    assert peak < bound, f"forwarding {size:,} bytes traced {peak:,} (bound {bound:,})"


def test_a_source_that_goes_away_leaves_the_receiver_a_whole_frame() -> None:
    size = 4 * PIPE_CHUNK

    async def main() -> None:
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        worker_end = SocketStream(left, loop)
        worker, upstream = Connection(worker_end), Connection(SocketStream(right, loop))
        downstream, client = _pair(loop)
        try:
            # Only the head and part of the value are sent before the worker goes.
            reply = DataReply(2, {"a": dumps(np.ones(size, np.uint8))}, [], {})
            head, stream, value = encode_frame([reply])
            worker_end.write([head, stream, memoryview(value)[:1000]])
            await worker.close()
            received = asyncio.create_task(client.recv())
            assert not await _forward(upstream, downstream)
            downstream.send(Heartbeat(3, 4))
            (got,) = await received
            assert isinstance(got, DataReply)  # whole, with zeros standing in
            assert await client.recv() == [Heartbeat(3, 4)]  # and the stream goes on
        finally:
            for conn in (worker, upstream, downstream, client):
                conn.abort()

    _run(main)
