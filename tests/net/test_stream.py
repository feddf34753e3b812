"""Streams and connections carry bytes in order, large buffers without copies, and
say when the peer is gone; measured, not assumed."""

from __future__ import annotations

import asyncio
import ctypes
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.core.payload import Payload, dumps, loads
from apportion.net.connection import (
    Connection,
    ConnectionClosed,
    receive_buffer,
)
from apportion.net.receive_pool import POOL_FROM
from apportion.net.stream import READ_BUFFER, StreamClosed, byte_view
from apportion.protocol.codec import encode_frame
from apportion.protocol.peer_data import PutData
from apportion.protocol.worker import Heartbeat
from stream_pairs import PAIRS, Pair, opened, run, socket_pair

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("pair", PAIRS)
@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=20),
    st.lists(st.integers(1, 5000), min_size=1, max_size=20),
)
def test_bytes_arrive_in_order_however_written_and_read(
    pair: Pair, writes: list[bytes], reads: list[int]
) -> None:
    async def main() -> bytes:
        async with opened(pair) as (a, b):
            for chunk in writes:
                a.write([chunk, chunk[:1]])
            total = sum(2 * len(c) if c else 0 for c in writes) - sum(
                len(c) - 1 for c in writes if c
            )
            got = bytearray()
            sizes = iter(reads * (total + 1))
            while len(got) < total:
                n = min(next(sizes), total - len(got))
                if n % 2:
                    got += await b.read_exactly(n)
                else:
                    view = memoryview(bytearray(n))
                    await b.read_into(view)
                    got += view
            return bytes(got)

    expected = b"".join(c + c[:1] for c in writes)
    assert run(main()) == expected


@pytest.mark.parametrize("pair", PAIRS)
def test_read_into_fills_the_callers_buffer_and_a_large_read_exactly_gets_its_own(
    pair: Pair,
) -> None:
    async def main() -> None:
        async with opened(pair) as (a, b):
            data = np.arange(8 * 2**20, dtype=np.uint8)
            a.write([b"head", memoryview(data)])
            assert await b.read_exactly(4) == b"head"
            target = bytearray(len(data))
            await b.read_into(memoryview(target))
            assert np.array_equal(np.frombuffer(target, np.uint8), data)
            a.write([b"z" * (READ_BUFFER + 1)])
            assert await b.read_exactly(READ_BUFFER + 1) == b"z" * (READ_BUFFER + 1)

    run(main())


@pytest.mark.parametrize("pair", PAIRS)
def test_the_peer_closing_mid_read_is_said_with_what_came(pair: Pair) -> None:
    async def main() -> None:
        async with opened(pair) as (a, b):
            a.write([b"abc"])
            await a.close()
            with pytest.raises(StreamClosed) as caught:
                await b.read_exactly(10)
            assert caught.value.partial == b"abc"
            assert b.closed
            # A failed read takes nothing: what came can still be read, then the end.
            assert await b.read_some(5) == b"abc"
            assert await b.read_some(5) == b""

    run(main())


def test_a_reader_that_does_not_read_holds_the_writer_back_and_drain_waits() -> None:
    async def main() -> None:
        async with opened(socket_pair) as (a, b):
            big = bytes(64 * 2**20)
            a.write([big])
            # What the socket did not take at once waits unsent, uncopied.
            assert a.queued() > 32 * 2**20
            drained = asyncio.ensure_future(a.drain())
            for _ in range(20):  # loop turns: b's buffer fills and it stops reading
                await asyncio.sleep(0)
            assert not drained.done()
            target = memoryview(bytearray(len(big)))
            await b.read_into(target)
            await asyncio.wait_for(drained, 10)
            assert a.queued() == 0 and target == big

    run(main())


def test_writing_to_a_peer_that_went_away_fails_that_stream_only() -> None:
    async def main() -> None:
        async with opened(socket_pair) as (a, b):
            b.abort()
            for _ in range(100):  # the reset shows on a write or the next read
                a.write([bytes(2**16)])
                await asyncio.sleep(0.001)
                if a.closed:
                    break
            assert a.closed
            with pytest.raises(StreamClosed):
                await a.read_exactly(1)

    run(main())


# --- connections: payloads without copies ------------------------------------------------


async def _connections(pair: Pair) -> tuple[Connection, Connection]:
    a, b = await pair()
    return Connection(a), Connection(b)


@pytest.mark.parametrize("pair", PAIRS)
def test_payloads_cross_a_connection_and_are_rebuilt_in_the_received_buffers(
    pair: Pair,
) -> None:
    async def main() -> None:
        sender, receiver = await _connections(pair)
        try:
            array = np.arange(2**20, dtype=np.float64)
            frame = np.zeros(3)
            sender.send(PutData(7, {"a": dumps(array), "b": dumps(frame), "c": dumps(b"x")}))
            (message,) = await receiver.recv()
            assert isinstance(message, PutData) and message.request_id == 7
            got = message.data["a"]
            assert isinstance(got, Payload)
            back = loads(got)
            assert np.array_equal(back, array)
            assert np.shares_memory(back, np.frombuffer(got.frames[1], np.uint8))
            assert np.array_equal(loads(message.data["b"]), frame)
            assert loads(message.data["c"]) == b"x"
        finally:
            sender.abort()
            receiver.abort()

    run(main())


def test_a_transfer_copies_nothing_in_python_and_receives_into_one_buffer() -> None:
    """Sender and receiver in one process. Every copy made in Python (pickling, joining
    frames, buffering) would show in the traced heap; the traced peak stays far below
    the value's size, and the value lives in the one receiving buffer (a memory map of
    the receive pool, not traced): the kernel's copy into it is the only one."""
    size = 64 * 2**20

    async def main() -> tuple[int, Payload, np.ndarray[Any, Any]]:
        sender, receiver = await _connections(socket_pair)
        try:
            array = np.ones(size, dtype=np.uint8)
            pickled = dumps(array)
            tracemalloc.start()
            try:
                tracemalloc.reset_peak()
                sender.send(PutData(1, {"a": pickled}))
                (message,) = await receiver.recv()
                back = loads(message.data["a"])  # type: ignore[attr-defined]
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            return peak, message.data["a"], back  # type: ignore[attr-defined]
        finally:
            sender.abort()
            receiver.abort()

    peak, got, back = run(main())
    assert peak < size // 100, f"traced peak {peak:,} for {size:,} bytes"
    assert isinstance(got, Payload) and len(got.frames) == 2
    frame = memoryview(got.frames[1])
    assert isinstance(frame.obj, ctypes.Array) and frame.nbytes == size
    assert np.shares_memory(back, np.frombuffer(frame, np.uint8)) and int(back.sum()) == size


def test_large_buffers_come_from_the_pool_and_small_ones_are_bytearrays() -> None:
    buffer = receive_buffer(POOL_FROM)
    assert isinstance(buffer.obj, ctypes.Array) and buffer.nbytes == POOL_FROM
    small = receive_buffer(POOL_FROM - 1)
    assert isinstance(small.obj, bytearray)


def test_a_connection_whose_peer_goes_raises_connection_closed() -> None:
    async def main() -> None:
        sender, receiver = await _connections(socket_pair)
        sender.send(Heartbeat(1, 2))
        await sender.close()
        assert await receiver.recv() == [Heartbeat(1, 2)]
        with pytest.raises(ConnectionClosed):
            await receiver.recv()

    run(main())


@pytest.mark.parametrize("pair", PAIRS)
@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=8), st.data())
def test_frames_are_received_whole_however_their_bytes_are_split(
    pair: Pair, numbers: list[int], data: st.DataObject
) -> None:
    # A frame that arrived whole is taken at once; one split anywhere (in its header,
    # its buffer lengths, its body or its buffers) is waited for part by part.
    messages = [
        PutData(n, {"k": dumps(bytes(n % 300))}) if n % 3 == 0 else Heartbeat(n) for n in numbers
    ]
    wire = b"".join(bytes(byte_view(b)) for m in messages for b in encode_frame([m]))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(wire) - 1), max_size=12)))

    async def main() -> list[Any]:
        async with opened(pair) as (a, b):
            receiver = Connection(b)
            receiver.stall_timeout = 10.0

            async def receive() -> list[Any]:
                return [m for _ in messages for m in await receiver.recv()]

            received = asyncio.ensure_future(receive())
            for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
                a.write([wire[start:end]])
                await asyncio.sleep(0)
            return await received

    got = run(main())
    assert [type(m) for m in got] == [type(m) for m in messages]
    for sent, arrived in zip(messages, got, strict=True):
        if isinstance(sent, Heartbeat):
            assert arrived == sent
        else:
            assert arrived.request_id == sent.request_id
            assert loads(arrived.data["k"]) == loads(sent.data["k"])
