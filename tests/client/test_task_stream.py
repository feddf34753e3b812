"""get_task_stream() and Client.get_task_stream: the executions of a block as Dask's records."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import dask.array as da
import pytest

from apportion import Client, get_task_stream
from apportion.client.task_stream import dropped, select, warn_dropped
from apportion.testing import InMemoryCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(30)


def inc(x: int) -> int:
    return x + 1


def fail(_: Any = None) -> None:
    raise ValueError("fails on purpose")


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    workers = [
        {"name": "gpu", "nthreads": 2, "resources": "gpu=[0,1]"},
        {"name": "cpu", "nthreads": 1},
    ]
    with InMemoryCluster(workers) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with Client(cluster.address) as client:
        yield client


def test_the_block_gets_every_execution_as_dasks_records(client: Client) -> None:
    client.submit(inc, 100).result()  # before the block: not in it
    began = time.time()
    with get_task_stream() as ts:
        futures = client.map(inc, range(4), resources={"gpu": 1})
        failing = client.submit(fail)
        client.gather(futures)
        with pytest.raises(ValueError, match="on purpose"):
            failing.result()
        assert da.ones(8, chunks=2).sum().compute() == 8  # on the default client
    ended = time.time()
    by_key = {record["key"]: record for record in ts.data}
    assert len(by_key) == len(ts.data)
    assert {f.key for f in futures} | {failing.key} <= set(by_key)
    assert {"ones", "sum"} & {record["group"] for record in ts.data}
    assert by_key[failing.key]["status"] == "error"
    assert {by_key[f.key]["status"] for f in futures} == {"OK"}
    assert {by_key[f.key]["resources"]["gpu"] for f in futures} == {1.0}
    stops = []
    for record in ts.data:
        (span,) = record["startstops"]
        assert span["action"] == "compute"
        # On this machine's clock: inside the block, give or take the reply's transit.
        assert began - 1 < span["start"] <= span["stop"] < ended + 1
        stops.append(span["stop"])
        assert isinstance(record["worker"], str) and isinstance(record["thread"], int)
    assert stops == sorted(stops)
    assert ts.figure is None


def test_client_get_task_stream_takes_dasks_start_stop_and_count(
    client: Client, tmp_path: Path
) -> None:
    client.gather(client.map(inc, range(10, 15)))
    # Each reply has its own clock offset (module docstring of task_stream): compare keys.
    everything = keys(client.get_task_stream())
    assert len(everything) >= 5
    assert keys(client.get_task_stream(count=2)) == everything[-2:]
    assert keys(client.get_task_stream(start="1h")) == everything
    assert keys(client.get_task_stream(stop="1h")) == []
    assert client.get_task_stream(start=time.time() + 60) == []
    records, page = client.get_task_stream(count=2, plot="save", filename=tmp_path / "ts.html")
    assert page == tmp_path / "ts.html" and keys(records) == everything[-2:]
    assert all(key in page.read_text() for key in keys(records))
    with pytest.raises(NotImplementedError, match="performance_report"):
        client.get_task_stream(plot=True)
    with pytest.raises(NotImplementedError, match="plot='save'"):
        get_task_stream(plot=True)


def test_an_asynchronous_client_records_with_async_with(cluster: InMemoryCluster) -> None:
    async def run() -> tuple[str, list[dict[str, Any]]]:
        async with Client(cluster.address, asynchronous=True, set_as_default=False) as client:
            async with get_task_stream(client) as ts:
                future = client.submit(inc, 41)
                assert await future == 42
            assert keys(await client.get_task_stream(count=1)) == keys(ts.data[-1:])
            return future.key, ts.data

    key, data = asyncio.run(run())
    assert [record["key"] for record in data] == [key]


def keys(records: list[dict[str, Any]]) -> list[str]:
    return [record["key"] for record in records]


def record(stop: float) -> dict[str, Any]:
    return {"startstops": [{"action": "compute", "start": stop - 1, "stop": stop}]}


def test_select_reads_bounds_as_dask_does() -> None:
    records = [record(t) for t in (10.0, 20.0, 30.0, 40.0)]
    assert select(records) == records
    assert select(records, start=20.0) == records[1:]
    assert select(records, stop=30.0) == records[:2]
    assert select(records, start=15.0, stop=35.0) == records[1:3]
    assert select(records, count=3) == records[1:]
    assert select(records, start=20.0, count=1) == records[1:2]
    assert select(records, stop=40.0, count=1) == records[2:3]
    assert select(records, count=10) == records


def test_executions_the_scheduler_no_longer_kept_are_counted_and_said() -> None:
    items = [[n, "w", 0, f"k{n}", "k", 0.0, 1.0, True, {}] for n in range(71, 101)]
    assert dropped(since=10, seq=100, items=items) == 60
    assert dropped(since=70, seq=100, items=items) == 0
    with pytest.warns(RuntimeWarning, match="60 executions of the task stream are missing"):
        warn_dropped(60)
