"""scatter with Dask's keywords: where the data goes, broadcast, direct, timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster, UnsatisfiableError, get_worker
from apportion.protocol.peer_data import PutData
from apportion.protocol.tasks import CancelKeys, ScatterReply, ScatterRequest
from apportion.testing import InMemoryCluster, SimulatedCluster
from cluster_checks import InProcess, checked_client

WORKERS = [{"name": "a"}, {"name": "b"}, {"name": "c"}]


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(WORKERS) as c:
        yield c


#: Each client test runs both ways data can travel.
DIRECT = pytest.fixture(params=[False, True], ids=["through-scheduler", "direct"])


@DIRECT
def client(cluster: InProcess, request: pytest.FixtureRequest) -> Iterator[Client]:
    with checked_client(cluster, direct_to_workers=request.param) as c:
        yield c


@pytest.fixture(scope="module")
def tcp_cluster() -> Iterator[LocalCluster]:
    """Workers at TCP addresses, for what names them by host or bare address."""
    with LocalCluster(workers=WORKERS, processes=False) as c:
        yield c


@DIRECT
def tcp_client(tcp_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Client]:
    with checked_client(tcp_cluster, direct_to_workers=request.param) as c:
        yield c


def holders(client: Client, future: object) -> set[str]:
    names = {w["name"]: address for address, w in client.scheduler_info()["workers"].items()}
    by_address = {address: name for name, address in names.items()}
    return {by_address[a] for a in client.who_has(future)[future.key]}  # type: ignore[attr-defined]


def where(value: object) -> str:
    return get_worker().name


def test_scatter_to_named_workers(client: Client) -> None:
    futures = client.scatter(list(range(6)), workers=["b"])
    assert all(holders(client, f) == {"b"} for f in futures)
    assert client.gather(futures) == list(range(6))
    one = client.scatter({"x": 1}, workers="c", hash=False)
    assert holders(client, one["x"]) == {"c"}


def test_broadcast_copies_to_every_worker(client: Client) -> None:
    [table] = client.scatter([list(range(100))], broadcast=True)
    assert holders(client, table) == {"a", "b", "c"}
    assert client.submit(len, table).result() == 100
    some = client.scatter([1, 2], broadcast=True, workers=["a", "b"])
    assert all(holders(client, f) == {"a", "b"} for f in some)


def test_direct_overrides_the_client_default(client: Client) -> None:
    future = client.scatter("payload", direct=not client.direct_to_workers)
    assert future.result() == "payload"


def test_scatter_to_a_worker_nobody_has_fails_on_a_local_cluster(client: Client) -> None:
    if client.direct_to_workers:  # the client itself picks workers
        with pytest.raises(RuntimeError, match=r"no workers matching \['nobody'\]"):
            client.scatter([1], workers=["nobody"])
    else:  # a local cluster cannot grow: no such worker will ever come
        with pytest.raises(UnsatisfiableError, match="no worker matches nobody"):
            client.scatter([1], workers=["nobody"])


def test_a_scatter_given_up_on_is_not_stored_when_its_worker_comes() -> None:
    sim = SimulatedCluster()  # a cluster that may grow: the request waits
    sim.add_client("c1")
    sim.add_worker("a")
    sim.client_says("c1", ScatterRequest(1, {"x": b"1"}, ["b"]))
    assert not [msg for msg in sim.inbox["c1"] if isinstance(msg, ScatterReply)]
    sim.client_says("c1", CancelKeys(["x"]))  # the client timed out
    sim.add_worker("b")
    assert not [msg for msg in sim.to_workers.get("w2", []) if isinstance(msg, PutData)]
    assert "x" not in sim.state.tasks


def test_a_scatter_waits_for_its_worker_on_a_cluster_that_may_grow() -> None:
    sim = SimulatedCluster()
    sim.add_client("c1")
    sim.add_worker("a")
    sim.client_says("c1", ScatterRequest(1, {"x": b"1"}, ["b"]))
    b = sim.add_worker("b")
    (put,) = [msg for msg in sim.to_workers[b] if isinstance(msg, PutData)]
    assert list(put.data) == ["x"]


def test_scatter_and_gather_asked_to_be_asynchronous_give_awaitables(client: Client) -> None:
    async def main() -> list[int]:
        futures = await client.scatter([1, 2], asynchronous=True)
        values: list[int] = await client.gather(futures, asynchronous=True)
        return values

    assert asyncio.run(main()) == [1, 2]  # a blocking client, asked as Dask's are


@pytest.mark.tcp
def test_broadcast_and_replicate_name_workers_as_everywhere_else(tcp_client: Client) -> None:
    client = tcp_client
    addresses = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
    [by_host] = client.scatter([[1, 2]], workers=["127.0.0.1"], broadcast=True)
    assert holders(client, by_host) == {"a", "b", "c"}  # a host names all its workers
    bare = addresses["b"].removeprefix("tcp://")
    [one] = client.scatter([[3]], workers=["a"])
    client.replicate([one], workers=["a", bare])  # an address without its scheme
    assert holders(client, one) == {"a", "b"}
    with pytest.raises(ValueError, match="no connected worker is named, or listens at, 'nobody'"):
        client.replicate([one], workers=["nobody"])
    with pytest.raises(ValueError, match="'nobody'"):
        client.rebalance(workers=["nobody"])


def test_scattering_nothing_gives_nothing_back_at_once(client: Client) -> None:
    assert client.scatter([]) == []
    assert client.scatter(()) == ()
    assert client.scatter({}) == {}
