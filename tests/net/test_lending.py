"""Same-machine lending: a receiver reads large buffers from the sender's memory."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import textwrap
import tracemalloc
import weakref
from typing import Any

import numpy as np
import pytest

from apportion.core.payload import dumps, loads
from apportion.net import lending
from apportion.net.connection import Connection
from apportion.net.stream import SocketStream
from apportion.protocol.codec import ProtocolError
from apportion.protocol.handshake import BuffersReturned, LendBuffers, Welcome
from apportion.protocol.peer_data import DataReply

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not lending.offer(), reason="no process_vm_readv on this platform"),
]

MiB = 1 << 20


def _pair(loop: asyncio.AbstractEventLoop) -> tuple[Connection, Connection]:
    left, right = socket.socketpair()
    return Connection(SocketStream(left, loop)), Connection(SocketStream(right, loop))


def _run(main: Any) -> Any:
    return asyncio.run(main())


async def _lending_pair() -> tuple[Connection, Connection]:
    """A lender (offered, and asked by its peer) and a borrower, both in this process."""
    lender, borrower = _pair(asyncio.get_running_loop())
    lender.offer_lending()
    borrower.borrow_from(os.getpid())
    assert await lender.recv() == []  # LendBuffers, taken by the connection itself
    return lender, borrower


def test_a_buffer_is_read_from_its_address() -> None:
    data = bytes(range(256)) * 4096
    into = memoryview(bytearray(len(data)))
    lending.read_lent(os.getpid(), lending.address_of(data), into)
    assert into == data


def test_reading_where_nothing_is_mapped_is_an_os_error() -> None:
    with pytest.raises(OSError, match="cannot read process"):
        lending.read_lent(os.getpid(), 8, memoryview(bytearray(16)))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    "change",
    [
        lambda offer: [offer[0], offer[1], b"\x00" * 16],  # not the bytes found there
        lambda offer: [_dead_pid(), offer[1], offer[2]],  # no such process
        lambda offer: [offer[0], 8, offer[2]],  # nothing mapped there
        lambda offer: [offer[0], offer[1]],  # malformed
        lambda offer: "lender",
    ],
    ids=["other-bytes", "no-process", "unmapped", "short", "not-a-list"],
)
def test_a_probe_is_found_only_where_it_was_offered(change: Any) -> None:
    offer = lending.offer()["lender"]
    assert lending.lender_in({"lender": offer}) == os.getpid()
    assert lending.lender_in({"lender": change(offer)}) is None
    assert lending.lender_in({}) is None


def test_a_lent_value_arrives_equal_and_is_held_until_returned() -> None:
    held = [np.arange(4 * MiB // 8, dtype=np.float64)]
    gone = weakref.ref(held[0])

    async def main() -> None:
        lender, borrower = await _lending_pair()
        try:
            lender.send(DataReply(1, {"big": dumps(held[0]), "small": dumps(b"x")}, [], {}))
            await lender.drain()
            assert lender.lent_frames == 1
            held.clear()
            gc.collect()
            assert gone() is not None  # the lender keeps it alive for the borrower
            tracemalloc.start()
            try:
                ((reply,),) = [await borrower.recv()]
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            # Read straight into the receive pool's map (not traced): no copy in Python.
            assert peak < MiB // 4, f"traced peak {peak:,} receiving 4 MiB"
            assert isinstance(reply, DataReply)
            got = loads(reply.data["big"])
            assert np.array_equal(got, np.arange(4 * MiB // 8, dtype=np.float64))
            assert not np.shares_memory(got, np.asarray(gone()))  # a copy of its own
            assert loads(reply.data["small"]) == b"x"
            assert await lender.recv() == []  # BuffersReturned
            assert lender.lent_frames == 0
            gc.collect()
            assert gone() is None
        finally:
            lender.abort()
            borrower.abort()

    _run(main)


def test_nothing_is_lent_unless_the_peer_asks() -> None:
    async def main() -> None:
        lender, receiver = _pair(asyncio.get_running_loop())
        lender.offer_lending()  # offered, never asked
        try:
            lender.send(DataReply(1, {"big": dumps(bytes(2 * MiB))}, [], {}))
            ((reply,),) = [await receiver.recv()]
            assert isinstance(reply, DataReply) and loads(reply.data["big"]) == bytes(2 * MiB)
            assert lender.lent_frames == 0
        finally:
            lender.abort()
            receiver.abort()

    _run(main)


def test_a_buffer_lent_unasked_is_refused() -> None:
    async def main() -> None:
        lender, receiver = _pair(asyncio.get_running_loop())
        lender.offer_lending()
        receiver.send(LendBuffers(1))  # asked, but the receiver reads no lender
        try:
            assert await lender.recv() == []
            lender.send(DataReply(1, {"big": dumps(bytes(2 * MiB))}, [], {}))
            with pytest.raises(ProtocolError, match="lent a buffer it was not asked to lend"):
                await receiver.recv()
        finally:
            lender.abort()
            receiver.abort()

    _run(main)


def test_returning_more_than_was_lent_is_refused() -> None:
    async def main() -> None:
        lender, borrower = await _lending_pair()
        borrower.send(BuffersReturned(1))
        try:
            with pytest.raises(ProtocolError, match="returned 1 lending frames of 0"):
                await lender.recv()
        finally:
            lender.abort()
            borrower.abort()

    _run(main)


# The lender in a process of its own: it offers its probe in a Welcome, lends a 64 MiB
# array once asked, and reports how many lending frames were returned when it ends.
_LENDER = textwrap.dedent(
    """
    import asyncio, socket, sys
    import numpy as np
    from apportion.core.payload import dumps
    from apportion.net import lending
    from apportion.net.connection import Connection, ConnectionClosed
    from apportion.net.stream import SocketStream
    from apportion.protocol.base import PROTOCOL_VERSION
    from apportion.protocol.handshake import BuffersReturned, LendBuffers, Welcome
    from apportion.protocol.peer_data import DataReply

    async def main():
        sock = socket.socket(fileno=int(sys.argv[1]))
        conn = Connection(SocketStream(sock, asyncio.get_running_loop()))
        conn.offer_lending()
        conn.send(Welcome(PROTOCOL_VERSION, "lender", lending.offer()))
        assert await conn.recv() == []
        array = np.full(64 * 2**20 // 8, 7.0)
        conn.send(DataReply(1, {"a": dumps(array)}, [], {}))
        await conn.drain()
        lent = conn.lent_frames
        try:
            while True:
                await conn.recv()
        except ConnectionClosed:
            pass
        print(f"lent {lent}, outstanding {conn.lent_frames}", flush=True)

    asyncio.run(main())
    """
)


def test_a_value_is_lent_by_another_process() -> None:
    mine, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c", _LENDER, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        text=True,
    )
    theirs.close()

    async def main() -> None:
        conn = Connection(SocketStream(mine, asyncio.get_running_loop()))
        try:
            ((welcome,),) = [await conn.recv()]
            assert isinstance(welcome, Welcome)
            assert lending.lender_in(welcome.info) == child.pid
            conn.borrow_from(child.pid)
            ((reply,),) = [await conn.recv()]
            assert isinstance(reply, DataReply)
            array = loads(reply.data["a"])
            assert array.shape == (64 * MiB // 8,) and (array == 7.0).all()
        finally:
            await conn.close()

    try:
        _run(main)
        out, _ = child.communicate(timeout=30)
        assert child.returncode == 0
        assert out.strip() == "lent 1, outstanding 0"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_lending_switched_off_neither_offers_nor_borrows(monkeypatch: pytest.MonkeyPatch) -> None:
    offered = lending.offer()
    monkeypatch.setenv(lending.SWITCH, "0")
    assert lending.offer() == {}
    assert lending.lender_in(offered) is None
