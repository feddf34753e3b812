"""scatter with Dask's keywords: where the data goes, broadcast, direct, timeout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster, get_worker
from cluster_checks import checked_client


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=[{"name": "a"}, {"name": "b"}, {"name": "c"}], processes=False) as c:
        yield c


@pytest.fixture(params=[False, True], ids=["through-scheduler", "direct"])
def client(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Client]:
    with checked_client(cluster, direct_to_workers=request.param) as c:
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


def test_scatter_to_a_worker_nobody_has_waits_and_times_out(client: Client) -> None:
    if client.direct_to_workers:  # the client itself picks workers: it cannot wait
        with pytest.raises(RuntimeError, match=r"no workers matching \['nobody'\]"):
            client.scatter([1], workers=["nobody"])
    else:
        with pytest.raises(TimeoutError):
            client.scatter([1], workers=["nobody"], timeout=0.3)


def test_asynchronous_scatter_is_refused_clearly(client: Client) -> None:
    with pytest.raises(NotImplementedError, match="asynchronous"):
        client.scatter([1], asynchronous=True)
