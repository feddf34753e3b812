"""What one misbehaving peer can cost: a frame too large is refused before it is
allocated, a peer that reads nothing is dropped, and one that stops in the middle of
a frame is timed out; well-behaved peers, however slow or idle, are not affected."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import socket
import tracemalloc
import weakref
from typing import Any

import pytest

from apportion.core.payload import dumps, loads
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import HandshakeError, accept_connection
from apportion.net.security import Security
from apportion.net.stream import (
    LOW_WATER,
    MAX_UNSENT,
    STALL_TIMEOUT,
    Stream,
    StreamClosed,
    StreamStalled,
)
from apportion.net.transport import TCP
from apportion.protocol.base import PROTOCOL_VERSION, Message
from apportion.protocol.codec import (
    BUFFER_LENGTH,
    HEADER,
    MAX_BODY,
    MAX_FRAME,
    ProtocolError,
    encode_frame,
)
from apportion.protocol.handshake import Hello
from apportion.protocol.peer_data import PutData
from apportion.protocol.tasks import ReleaseKeys
from apportion.protocol.worker import Heartbeat
from stream_pairs import PAIRS, Pair, memory_pair, opened, run, socket_pair

pytestmark = pytest.mark.timeout(60)

SECURITY = Security.in_memory()


def test_the_defaults_for_services() -> None:
    assert MAX_UNSENT == 256 * 1024 * 1024
    assert STALL_TIMEOUT == 120.0


# --- frames too large: refused before they are allocated ----------------------------


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(HEADER.pack(MAX_BODY + 1, 0), id="body"),
        pytest.param(
            HEADER.pack(MAX_BODY, 1) + BUFFER_LENGTH.pack(MAX_FRAME), id="buffers-after-body"
        ),
        pytest.param(HEADER.pack(0, 2**32 - 1), id="buffer-count"),
    ],
)
def test_a_frame_over_the_limits_is_refused_before_anything_of_its_size_is_allocated(
    head: bytes,
) -> None:
    async def main() -> int:
        async with opened() as (a, b):
            receiver = Connection(b)
            a.write([head])
            tracemalloc.start()
            try:
                with pytest.raises(ProtocolError, match="exceeds the limit"):
                    await receiver.recv()
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            return peak

    assert run(main()) < 1 << 20


# --- a peer that reads nothing -------------------------------------------------------


def test_a_peer_that_reads_nothing_is_dropped_once_the_queue_passes_max_unsent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = 1 << 20
    chunk = bytes(64 * 1024)

    async def main() -> tuple[int, str]:
        async with opened() as (a, _reader):
            a.max_unsent = limit
            written = 0
            while not a.closed:
                a.write([chunk])
                written += len(chunk)
                assert written < 64 * limit, "the writer was never stopped"
                await asyncio.sleep(0)
            a.write([chunk])  # closed: ignored, and not logged again
            with pytest.raises(StreamClosed) as caught:
                await a.read_exactly(1)
            with pytest.raises(StreamClosed):
                await a.drain()
            return written, str(caught.value)

    with caplog.at_level(logging.WARNING, logger="apportion.net"):
        written, why = run(main())
    assert written > limit
    assert "reads nothing" in why and f"(limit {limit}); closing" in why
    warnings = [r for r in caplog.records if r.name == "apportion.net"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].getMessage() == why


def test_one_large_write_into_a_short_queue_is_taken_and_a_write_after_drain_too() -> None:
    big = bytes(16 << 20)

    async def main() -> None:
        async with opened() as (a, b):
            a.max_unsent = 1 << 20
            a.write([b"small"])
            a.write([big])
            assert not a.closed and a.queued() > a.max_unsent
            target = memoryview(bytearray(len(big) + 5))
            reading = asyncio.ensure_future(b.read_into(target))
            await a.drain()
            assert a.queued() <= LOW_WATER
            a.write([big])  # what waits is under the limit: taken
            assert not a.closed
            await reading
            again = memoryview(bytearray(len(big)))
            await b.read_into(again)
            assert not a.closed

    run(main())


def test_a_second_write_onto_a_queue_over_the_limit_closes_the_stream() -> None:
    async def main() -> None:
        async with opened() as (a, _reader):
            a.max_unsent = 1 << 20
            a.write([bytes(16 << 20)])
            assert not a.closed
            a.write([b"x"])
            assert a.closed and a.queued() == 0

    run(main())


def test_without_max_unsent_a_peer_may_leave_any_amount_unread() -> None:
    async def main() -> None:
        async with opened() as (a, _reader):
            assert a.max_unsent is None
            for _ in range(32):
                a.write([bytes(1 << 20)])
                await asyncio.sleep(0)
            assert not a.closed and a.queued() > 16 << 20

    run(main())


def test_a_connection_limited_in_unsent_bytes_drops_a_peer_that_reads_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with opened() as (a, _reader):
            sender = Connection(a)
            sender.limit_unsent(1 << 20)
            assert a.max_unsent == 1 << 20
            value = dumps(bytes(256 * 1024))
            for i in range(200):
                sender.send(PutData(i, {"v": value}))
                await asyncio.sleep(0)  # each turn's messages leave as one frame
                if sender.closed:
                    break
            assert sender.closed
            with pytest.raises(ConnectionClosed):
                await sender.recv()
            sender.limit_unsent(None)
            assert a.max_unsent is None

    with caplog.at_level(logging.WARNING, logger="apportion.net"):
        run(main())
    assert ["reads nothing" in r.getMessage() for r in caplog.records] == [True]


def test_a_memory_stream_queues_nothing_so_max_unsent_never_closes_it() -> None:
    async def main() -> None:
        async with opened(memory_pair) as (a, b):
            a.max_unsent = 0
            for _ in range(3):
                a.write([bytes(1 << 20)])
            assert a.queued() == 0 and not a.closed
            assert len(await b.read_exactly(3 << 20)) == 3 << 20

    run(main())


# --- a peer that stops in the middle of a frame ------------------------------------------

STALL = 0.3


def _frame(message: Message) -> bytes:
    return b"".join(bytes(piece) for piece in encode_frame([message]))


async def _trickle(stream: Stream, data: bytes, pieces: int, pause: float) -> None:
    step = -(-len(data) // pieces)
    for at in range(0, len(data), step):
        stream.write([data[at : at + step]])
        await asyncio.sleep(pause)


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize(
    "cut", [1, HEADER.size - 1, HEADER.size + 3], ids=["header", "head", "body"]
)
def test_a_peer_that_stops_in_the_middle_of_a_frame_is_a_protocol_error(
    pair: Pair, cut: int
) -> None:
    frame = _frame(ReleaseKeys(["x" * 40]))

    async def main() -> float:
        async with opened(pair) as (a, b):
            receiver = Connection(b)
            receiver.stall_timeout = STALL
            loop = asyncio.get_running_loop()
            a.write([frame[:cut]])
            started = loop.time()
            with pytest.raises(
                ProtocolError, match=re.escape(f"stalled in the middle of a frame for {STALL} s")
            ):
                await receiver.recv()
            assert receiver.closed  # its place in the stream is lost: of no further use
            return loop.time() - started

    assert STALL * 0.9 <= run(main()) < STALL + 5


def test_a_peer_that_stops_in_the_middle_of_a_buffer_is_a_protocol_error() -> None:
    frame = _frame(PutData(1, {"v": dumps(bytes(100_000))}))

    async def main() -> None:
        async with opened() as (a, b):
            receiver = Connection(b)
            receiver.stall_timeout = STALL
            a.write([frame[:-1000]])
            with pytest.raises(ProtocolError, match="stalled"):
                await receiver.recv()

    run(main())


def test_a_slow_but_steady_frame_longer_than_the_timeout_in_all_is_received() -> None:
    value = bytes(range(256)) * 400  # out of band: received by read_into
    frame = _frame(PutData(9, {"v": dumps(value)}))

    async def main() -> tuple[Message, float]:
        async with opened() as (a, b):
            receiver = Connection(b)
            receiver.stall_timeout = STALL
            loop = asyncio.get_running_loop()
            started = loop.time()
            # The buffer's part arrives into read_into's target: progress there, which
            # wakes no reader, must still count.
            sending = asyncio.ensure_future(_trickle(a, frame, 12, STALL / 4))
            (message,) = await receiver.recv()
            await sending
            return message, loop.time() - started

    message, took = run(main())
    assert isinstance(message, PutData) and message.request_id == 9
    assert loads(message.data["v"]) == value
    assert took > 2 * STALL


@pytest.mark.parametrize("pair", PAIRS)
def test_idle_between_frames_is_no_stall(pair: Pair) -> None:
    async def main() -> None:
        async with opened(pair) as (a, b):
            sender, receiver = Connection(a), Connection(b)
            receiver.stall_timeout = 0.1
            receiving = asyncio.ensure_future(receiver.recv())
            await asyncio.sleep(0.4)  # idle before the first frame
            sender.send(Heartbeat(1, 2))
            assert await receiving == [Heartbeat(1, 2)]
            receiving = asyncio.ensure_future(receiver.recv())
            await asyncio.sleep(0.4)  # and between frames
            assert not receiving.done()
            sender.send(Heartbeat(3, 4))
            assert await receiving == [Heartbeat(3, 4)]

    run(main())


def test_a_stream_read_times_out_without_bytes_but_readable_waits_for_ever() -> None:
    async def main() -> None:
        async with opened() as (a, b):
            b.stall_timeout = 0.1
            idle = asyncio.ensure_future(b.readable())
            await asyncio.sleep(0.3)
            assert not idle.done()
            a.write([b"ab"])
            await idle
            with pytest.raises(StreamStalled, match=re.escape("sent nothing for 0.1 s")) as caught:
                await b.read_exactly(3)
            assert caught.value.seconds == 0.1
            assert await b.read_exactly(2) == b"ab"  # a stalled read takes nothing
            b.stall_timeout = None
            reading = asyncio.ensure_future(b.read_exactly(1))
            await asyncio.sleep(0.3)
            assert not reading.done()
            a.write([b"c"])
            assert await reading == b"c"

    run(main())


def test_without_stall_timeout_a_peer_may_pause_in_a_frame_for_as_long_as_it_likes() -> None:
    frame = _frame(ReleaseKeys(["x"]))

    async def main() -> None:
        async with opened() as (a, b):
            receiver = Connection(b)
            assert receiver.stall_timeout is None
            a.write([frame[:5]])
            receiving = asyncio.ensure_future(receiver.recv())
            await asyncio.sleep(0.3)
            assert not receiving.done()
            a.write([frame[5:]])
            assert await receiving == [ReleaseKeys(["x"])]

    run(main())


# --- what a refused or dropped connection keeps -------------------------------------------


def test_a_refused_handshake_frees_its_connection_without_the_cycle_collector() -> None:
    """Each connection holds a read buffer of READ_BUFFER bytes: one kept alive by a
    reference cycle until the cycle collector runs would let a crowd of refused
    peers cost a buffer each, not the gate's bound."""

    async def main() -> weakref.ref[Stream]:
        a, b = await socket_pair()
        a.write([_frame(Hello(PROTOCOL_VERSION, "client", "no-proof"))])
        with contextlib.suppress(HandshakeError):
            await accept_connection(Connection(b), {"client"}, "p", {}, security=SECURITY)
        a.abort()
        return weakref.ref(b)

    gc.disable()
    try:
        assert run(main())() is None
    finally:
        gc.enable()


def test_a_listener_handles_each_queued_connection_before_accepting_the_next() -> None:
    """A burst of connections waiting in the backlog: each gets its handler (and its
    gate) before the next is accepted, so the buffers held are the gate's bound."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        accepted = 0
        accept = loop.sock_accept

        async def counting(sock: socket.socket) -> tuple[socket.socket, Any]:
            nonlocal accepted
            pair = await accept(sock)
            accepted += 1
            return pair

        loop.sock_accept = counting  # type: ignore[method-assign]
        seen: list[int] = []

        async def on_connect(stream: Stream) -> None:
            seen.append(accepted)
            stream.abort()

        listener = await TCP.listen("127.0.0.1", 0, on_connect)
        port = int(listener.address.rpartition(":")[2])
        peers = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        try:
            while len(seen) < len(peers):
                await asyncio.sleep(0.01)
        finally:
            listener.close()
            await listener.wait_closed()
            for peer in peers:
                peer.close()
        return seen

    assert run(main()) == list(range(1, 51))
