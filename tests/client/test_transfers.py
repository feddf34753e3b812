"""Large values go straight between client and workers; small ones, and those of
workers the client cannot reach, through the scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from apportion import Client, Future
from apportion.client import transfers
from apportion.client.session import Session
from apportion.net import connection
from apportion.net.connection import Connection
from apportion.net.receive_pool import STEP, ReceivePool
from apportion.testing import InMemoryCluster

pytestmark = pytest.mark.timeout(30)

LARGE = transfers.DIRECT_FROM  # bytes: the smallest value sent directly


def big_array(seed: int) -> np.ndarray[Any, Any]:
    return np.full(LARGE, seed % 256, dtype=np.uint8)


@pytest.fixture
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"name": "a"}, {"name": "b"}]) as c:
        yield c


class Peers:
    """Records the worker data ports a client opened, and refuses those listed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refused: set[str]) -> None:
        self.opened: list[str] = []
        self.refused = refused
        real = Session.peer

        async def peer(session: Session, address: str, timeout: float | None = None) -> Connection:
            if address in self.refused:
                raise OSError(f"cannot connect to {address}: no route to host")
            self.opened.append(address)
            return await real(session, address, timeout)

        monkeypatch.setattr(Session, "peer", peer)


def _holder(client: Client, future: Future) -> str:
    (address,) = client.who_has([future])[future.key]
    return address


def test_large_results_come_from_their_worker_small_ones_through_the_scheduler(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    peers = Peers(monkeypatch, set())
    client = cluster.client()
    small = client.submit(sum, [1, 2, 3])
    assert small.result() == 6
    assert peers.opened == []  # relayed in the scheduler's round trip
    big = client.submit(big_array, 7)
    value = big.result()
    assert value.nbytes == LARGE and int(value[0]) == 7
    assert peers.opened == [_holder(client, big)]


def test_results_of_a_worker_that_cannot_be_reached_are_relayed_and_it_is_not_tried_again(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = cluster.client()
    futures = client.map(big_array, range(4))
    assert all(f.result() is not None for f in futures)
    holders = {_holder(client, f) for f in futures}
    peers = Peers(monkeypatch, set(holders))
    values = client.gather(futures)
    assert [int(v[0]) for v in values] == [0, 1, 2, 3]
    assert client._session.unreachable == holders
    assert peers.opened == []
    assert [int(v[0]) for v in client.gather(futures)] == [0, 1, 2, 3]


def test_direct_true_fails_on_an_unreachable_worker_and_false_always_relays(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    relayed = cluster.client(direct_to_workers=False)
    future = relayed.submit(big_array, 3)
    assert future.result() is not None
    peers = Peers(monkeypatch, {_holder(relayed, future)})
    assert int(relayed.gather(future)[0]) == 3 and peers.opened == []
    strict = cluster.client(direct_to_workers=True)
    mine = strict.submit(big_array, 3)
    with pytest.raises(OSError, match="no route to host"):
        strict.gather(mine)


def test_large_scatters_go_to_the_workers_and_fall_back_to_the_relay(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    peers = Peers(monkeypatch, set())
    client = cluster.client()
    [small] = client.scatter([b"tiny"])
    assert peers.opened == [] and client.gather(small) == b"tiny"
    [big] = client.scatter([big_array(5)])
    assert peers.opened == [_holder(client, big)]
    assert client.submit(lambda a: int(a.sum()), big).result() == 5 * LARGE
    # Every worker unreachable: the scheduler places the data instead.
    addresses = set(client.scheduler_info()["workers"])
    peers.refused = addresses
    peers.opened.clear()
    [far] = client.scatter([big_array(9)])
    # The one worker tried is remembered as out of reach.
    assert peers.opened == [] and len(client._session.unreachable & addresses) == 1
    assert client.submit(lambda a: int(a[0]), far).result() == 9


def test_a_large_result_lets_go_of_its_memory_once_the_client_drops_it(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = ReceivePool(idle_for=600.0)  # nothing ages out meanwhile
    monkeypatch.setattr(connection, "POOL", pool)
    client = cluster.client()
    big = client.submit(big_array, 7)
    value = big.result()
    assert int(value[0]) == 7 and pool.free_bytes == 0  # it lives in the pool's map
    del value
    assert pool.free_bytes == STEP  # nothing else in the client kept the answer


def test_a_value_put_on_a_data_port_lets_go_of_its_memory_once_the_worker_drops_it(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = ReceivePool(idle_for=600.0)
    monkeypatch.setattr(connection, "POOL", pool)
    client = cluster.client()
    future = client.scatter(big_array(3), direct=True, workers=["a"])
    (worker,) = [w for w in cluster.workers if w.name == "a"]
    assert int(worker.data[future.key][0]) == 3 and pool.free_bytes == 0

    async def forget() -> None:  # on the worker's loop, as freeing the key would
        del worker.data[future.key]

    cluster.run(forget())
    assert pool.free_bytes == STEP  # nothing on the data port kept the request
