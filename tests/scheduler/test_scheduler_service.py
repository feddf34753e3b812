"""The scheduler's port under bad input: each bad peer loses its connection, nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import socket
import struct
from collections.abc import Iterator

import msgpack
import pytest

from apportion import Client, Scheduler, Worker
from apportion.net.address import parse_address
from apportion.net.connection import Connection
from apportion.net.handshake import HandshakeError, accept_connection, open_connection
from apportion.net.security import Security
from apportion.net.stream import OnConnect, Stream
from apportion.net.transport import TCP
from apportion.protocol.base import PROTOCOL_VERSION, Message
from apportion.protocol.codec import HEADER, MAX_HANDSHAKE_FRAME, decode_frame, encode_frame
from apportion.protocol.handshake import Hello, Refused, Welcome
from apportion.protocol.tasks import KeysDone

SECURITY = Security.in_memory()


def frame(*messages: Message) -> bytes:
    """One frame as the bytes on the wire."""
    return b"".join(encode_frame(list(messages)))


pytestmark = pytest.mark.tcp  # an in-process cluster over real TCP


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Scheduler, Worker]]:
    with Scheduler(port=0) as scheduler, Worker(scheduler.address, nthreads=1) as worker:
        yield scheduler, worker


def raw_exchange(address: str, payload: bytes) -> bytes:
    """Send raw bytes; return whatever comes back before the scheduler closes on us."""
    host, port = parse_address(address)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(payload)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def still_works(address: str) -> None:
    with Client(address) as client:
        assert client.submit(operator.add, 40, 2).result(timeout=10) == 42


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        HEADER.pack(5, 0) + b"\xc1\xc1\xc1\xc1\xc1",  # msgpack's never-used byte
        frame(KeysDone(["x"])),  # a valid frame that is not a Hello
        HEADER.pack(MAX_HANDSHAKE_FRAME + 1, 0),  # a huge frame before authentication
        HEADER.pack(10, 2) + struct.pack("!QQ", 2**40, 2**40),  # huge buffers, likewise
    ],
)
def test_garbage_closes_only_that_connection(
    cluster: tuple[Scheduler, Worker], garbage: bytes
) -> None:
    scheduler, _ = cluster
    raw_exchange(scheduler.address, garbage)
    still_works(scheduler.address)


def test_garbage_after_the_handshake_closes_only_that_connection(
    cluster: tuple[Scheduler, Worker],
) -> None:
    scheduler, _ = cluster
    hello = frame(Hello(PROTOCOL_VERSION, "client", "rogue"))
    raw_exchange(scheduler.address, hello + HEADER.pack(3, 0) + b"\x93\x01\x02")
    still_works(scheduler.address)


def test_version_mismatch_is_refused_naming_both_versions(
    cluster: tuple[Scheduler, Worker],
) -> None:
    scheduler, _ = cluster
    reply = raw_exchange(scheduler.address, frame(Hello(99, "client", "future")))
    (refused,) = decode_frame(reply)
    assert isinstance(refused, Refused)
    assert f"version {PROTOCOL_VERSION}" in refused.reason and "version 99" in refused.reason
    still_works(scheduler.address)


def _handshake_error(serve: OnConnect, role: str) -> str:
    """What connecting as ``role`` to a TCP server run by ``serve`` raises."""

    async def main() -> str:
        server = await TCP.listen("127.0.0.1", 0, serve)
        try:
            await open_connection(server.address, role, "me", security=SECURITY)
        except HandshakeError as exc:
            return str(exc)
        finally:
            server.close()
        return "connected"

    return asyncio.run(main())


def test_client_refuses_a_server_speaking_another_version() -> None:
    async def serve(stream: Stream) -> None:
        conn = Connection(stream)
        await conn.recv()
        conn.send(Welcome(99, "x", {}))
        await conn.close()

    message = _handshake_error(serve, "client")
    assert f"version {PROTOCOL_VERSION}" in message and "version 99" in message


def test_unknown_role_is_refused() -> None:
    async def serve(stream: Stream) -> None:
        conn = Connection(stream)
        with contextlib.suppress(HandshakeError):
            await accept_connection(conn, {"client"}, "p1", {}, security=SECURITY)

    assert "role 'intruder' is not served" in _handshake_error(serve, "intruder")


def test_msgpack_of_a_hello_is_what_the_handshake_reads() -> None:
    # The handshake frame is tiny and plain: [[tag, version, role, name]].
    (head,) = encode_frame([Hello(PROTOCOL_VERSION, "client", "c")])
    assert HEADER.unpack(head[: HEADER.size]) == (len(head) - HEADER.size, 0)
    body = msgpack.unpackb(head[HEADER.size :])
    assert body == [[Hello.TAG, PROTOCOL_VERSION, "client", "c"]]
