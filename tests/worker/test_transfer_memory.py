"""What a transfer leaves behind, over real connections on loopback: once a value has
arrived and both sides let it go, neither holds its memory any more."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import numpy as np
import pytest

from apportion.core.payload import loads
from apportion.net import connection, lending
from apportion.net.receive_pool import ReceivePool
from apportion.net.security import Security
from apportion.protocol.peer_data import DataReply
from apportion.worker.data_server import DataServer
from apportion.worker.peers import PeerPool

pytestmark = [pytest.mark.tcp, pytest.mark.timeout(30)]

MiB = 1 << 20
#: Lent, and read on the loop: a larger buffer is read in a thread, whose work item
#: lets go of it a moment after the read is over, in its own time.
SIZE = 2 * MiB
SECURITY = Security(token="t" * 32, token_source="a test")


@pytest.mark.parametrize("lend", [True, False], ids=["lent", "over-tcp"])
def test_neither_side_keeps_a_fetched_value_once_both_let_it_go(
    lend: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if lend and not lending.enabled():
        pytest.skip("this process cannot read another's memory here")
    assert SIZE < connection.READ_IN_THREAD_FROM
    monkeypatch.setenv(lending.SWITCH, "1" if lend else "0")
    pool = ReceivePool(idle_for=600.0)  # the receiver's: nothing ages out meanwhile
    monkeypatch.setattr(connection, "POOL", pool)
    data: dict[str, Any] = {"x": np.arange(SIZE // 8, dtype=np.float64)}
    sent = weakref.ref(data["x"])
    got: dict[str, Any] = {}

    def arrived(part: DataReply) -> None:
        got.update((key, loads(blob)) for key, blob in part.data.items())

    async def main() -> None:
        server = DataServer(data, "a", "127.0.0.1", 0, security=SECURITY)
        await server.start()
        peers = PeerPool("b", SECURITY)
        try:
            await peers.get_data(server.address, ["x"], arrived)
            assert np.array_equal(got["x"], np.arange(SIZE // 8, dtype=np.float64))
            assert pool.free_bytes == 0  # the value lives in the pool's map
            got.clear()
            assert pool.free_bytes == SIZE  # nothing else kept the answer
            data.clear()
            # Requests on one connection are answered in order: by this answer the
            # data port has read everything sent before it (returned lent buffers).
            await peers.get_data(server.address, ["y"], arrived)
            assert got == {} and sent() is None
        finally:
            await peers.close()
            await server.close()

    asyncio.run(main())
