"""The in-memory transport: frames through the codec, the handshake, across event loops."""

from __future__ import annotations

import asyncio

import pytest

from apportion.loop_thread import LoopThread
from apportion.net.address import AddressError, check_address
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import HandshakeError, accept_connection, open_connection
from apportion.net.memory import MEMORY
from apportion.net.security import Security
from apportion.net.stream import Listener, Stream
from apportion.net.transport import TCP, serving_host, transport_for
from apportion.protocol.peer_data import PutData
from apportion.protocol.tasks import ReleaseKeys
from apportion.protocol.worker import Heartbeat

SECURITY = Security.in_memory()


async def _echo_server(address: str, roles: set[str]) -> Listener:
    """A listener that handshakes, then echoes every frame back."""

    async def serve(stream: Stream) -> None:
        conn = Connection(stream)
        try:
            await accept_connection(conn, roles, "peer-1", {"echo": True}, security=SECURITY)
            while True:
                for message in await conn.recv():
                    conn.send(message)
        except (ConnectionClosed, HandshakeError):
            pass
        finally:
            await conn.close()

    return await transport_for(address).listen(address, 0, serve)


def test_the_scheme_chooses_the_transport() -> None:
    assert transport_for("inproc://x") is MEMORY
    assert transport_for("tcp://127.0.0.1:1") is TCP
    assert transport_for("127.0.0.1:1") is TCP
    assert serving_host("inproc://s", "127.0.0.1") == "inproc://"
    assert serving_host("tcp://h:1", "127.0.0.1") == "127.0.0.1"
    check_address("inproc://a-b.c")
    with pytest.raises(AddressError):
        check_address("inproc://")
    with pytest.raises(AddressError):
        check_address("udp://h:1")


def test_a_handshake_and_frames_over_memory_on_one_loop() -> None:
    asyncio.run(_a_handshake_and_frames_over_memory_on_one_loop())


async def _a_handshake_and_frames_over_memory_on_one_loop() -> None:
    listener = await _echo_server("inproc://echo-one-loop", {"client"})
    try:
        conn, welcome = await open_connection(
            "inproc://echo-one-loop", "client", "me", security=SECURITY
        )
        assert welcome.info == {"echo": True}
        conn.send(Heartbeat(3, 42))
        conn.send(ReleaseKeys(["a", "b"]))
        assert await conn.recv() == [Heartbeat(3, 42), ReleaseKeys(["a", "b"])]
        await conn.close()
        with pytest.raises(HandshakeError, match="role 'worker' is not served"):
            await open_connection("inproc://echo-one-loop", "worker", "me", security=SECURITY)
    finally:
        listener.close()
    assert "inproc://echo-one-loop" not in MEMORY.names()
    with pytest.raises(
        ConnectionRefusedError, match="cannot connect to inproc://echo-one-loop: connection refused"
    ):
        await open_connection(
            "inproc://echo-one-loop", "client", "me", security=SECURITY, timeout=1
        )


def test_a_name_is_taken_once() -> None:
    asyncio.run(_a_name_is_taken_once())


async def _a_name_is_taken_once() -> None:
    listener = await _echo_server("inproc://taken", {"client"})
    try:
        with pytest.raises(OSError, match="already in use"):
            await _echo_server("inproc://taken", {"client"})
    finally:
        listener.close()


def test_connections_cross_event_loops_and_closes_reach_the_other_side() -> None:
    asyncio.run(_connections_cross_event_loops_and_closes_reach_the_other_side())


async def _connections_cross_event_loops_and_closes_reach_the_other_side() -> None:
    other = LoopThread("memory-test")
    try:
        listener = other.run(_echo_server("inproc://echo-other-loop", {"client"}))
        conn, _ = await open_connection(
            "inproc://echo-other-loop", "client", "me", security=SECURITY
        )
        big = PutData(1, {"k": b"x" * 1_000_000})  # beyond the reader's buffer
        conn.send(big)
        assert await conn.recv() == [big]
        other.loop.call_soon_threadsafe(listener.close)
        await conn.close()
        assert conn.closed
    finally:
        other.stop()


def test_the_peer_closing_ends_the_readers_wait() -> None:
    asyncio.run(_the_peer_closing_ends_the_readers_wait())


async def _the_peer_closing_ends_the_readers_wait() -> None:
    async def close_at_once(stream: Stream) -> None:
        await stream.close()

    listener = await MEMORY.listen("inproc://closer", 0, close_at_once)
    try:
        conn = Connection(await MEMORY.connect("inproc://closer"))
        with pytest.raises(ConnectionClosed):
            await conn.recv()
    finally:
        listener.close()
