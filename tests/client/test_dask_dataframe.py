"""Dask dataframes on apportion: computed, persisted, and built on scattered frames.

Each answer is compared with pandas' own. The cluster runs in-process, so a partition
function can count its calls in a module global.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Iterator
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask.base import tokenize

from apportion import Client, Future, futures_of, task_resources
from apportion.testing import InMemoryCluster

pytestmark = pytest.mark.timeout(30)

#: Partition-function calls by the partition's first index value.
CALLS: collections.Counter[Any] = collections.Counter()
_calls_lock = threading.Lock()

FRAME = pd.DataFrame(
    {
        "k": np.arange(60) % 5,
        "v": np.arange(60, dtype=float) / 4,
        "w": (np.arange(60) * 7) % 61,  # distinct: a sortable index
    }
)
NAMES = pd.DataFrame({"k": range(5), "scale": [10.0, 20.0, 30.0, 40.0, 50.0]})


def counted(part: pd.DataFrame) -> pd.DataFrame:
    with _calls_lock:
        CALLS[part.index[0]] += 1
    return part


def on_apportion(part: pd.DataFrame) -> pd.DataFrame:
    task_resources()  # raises anywhere but in a task on an apportion worker
    return part


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"nthreads": 2}, {"nthreads": 2}]) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    CALLS.clear()
    with Client(cluster.address) as c:
        yield c


def frame() -> Any:
    """FRAME in four partitions, each counted once per computation of it."""
    return dd.from_pandas(FRAME, npartitions=4).map_partitions(counted, meta=FRAME.iloc[:0])


def sorted_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def check_derived(client: Client, persisted: Any) -> None:
    """groupby, merge and set_index of ``persisted`` give pandas' answers, through
    Dask's own compute and through the client's."""
    names = dd.from_pandas(NAMES, npartitions=2)
    mean = persisted.groupby("k").v.mean()
    merged = persisted.merge(names, on="k")
    indexed = persisted.set_index("w")
    expected_mean = FRAME.groupby("k").v.mean()
    expected_merge = sorted_frame(FRAME.merge(NAMES, on="k"))
    expected_index = FRAME.set_index("w").sort_index()

    pd.testing.assert_series_equal(mean.compute().sort_index(), expected_mean)
    pd.testing.assert_frame_equal(sorted_frame(merged.compute()), expected_merge)
    pd.testing.assert_frame_equal(indexed.compute(), expected_index)

    pd.testing.assert_series_equal(client.compute(mean).result().sort_index(), expected_mean)
    pd.testing.assert_frame_equal(sorted_frame(client.compute(merged).result()), expected_merge)
    pd.testing.assert_frame_equal(client.compute(indexed, sync=True), expected_index)


def test_a_dataframe_persisted_by_the_client_computes_as_pandas_does(client: Client) -> None:
    persisted = client.persist(frame())
    check_derived(client, persisted)
    # Every partition came from the persisted parts: none was made twice.
    assert sorted(CALLS.values()) == [1, 1, 1, 1]


def test_a_dataframe_persisted_by_dask_itself_lives_on_the_client(client: Client) -> None:
    persisted = frame().persist()
    (also,) = dask.persist(frame())
    graph = dict(persisted.__dask_graph__())
    parts = [value for value in graph.values() if isinstance(value, Future)]
    assert len(parts) == 4 and set(parts) == set(futures_of(persisted))
    check_derived(client, persisted)
    pd.testing.assert_frame_equal(also.compute(), FRAME)
    # The same collection twice names the same keys: the second persist shares the parts.
    assert sorted(CALLS.values()) == [1, 1, 1, 1]


def test_a_dataframe_computes_on_the_client_without_persist(client: Client) -> None:
    df = dd.from_pandas(FRAME, npartitions=3).map_partitions(on_apportion, meta=FRAME.iloc[:0])
    mean = df.groupby("k").mean()
    pd.testing.assert_frame_equal(mean.compute().sort_index(), FRAME.groupby("k").mean())
    pd.testing.assert_frame_equal(
        client.compute(mean, sync=True).sort_index(), FRAME.groupby("k").mean()
    )


def test_a_scattered_frame_is_an_argument_of_dask_delayed_calls(client: Client) -> None:
    future = client.scatter(FRAME)
    total = dask.delayed(lambda df: df.v.sum())(future)
    assert total.compute() == FRAME.v.sum()
    assert client.compute(total).result() == FRAME.v.sum()
    from_future = dd.from_delayed([dask.delayed(future)], meta=FRAME.iloc[:0])
    pd.testing.assert_series_equal(
        from_future.groupby("k").w.max().compute().sort_index(), FRAME.groupby("k").w.max()
    )


def test_futures_tokenize_by_the_key_they_name(client: Client) -> None:
    future = client.scatter(FRAME)
    same = Future(future.key, client)
    assert tokenize(future) == tokenize(same) == tokenize(future)
    assert tokenize(future) != tokenize(client.scatter(NAMES))


def test_future_type_is_the_class_of_the_result(client: Client) -> None:
    # Dask's test_serialize_collections_of_futures_sync: a persisted dataframe
    # scattered is rebuilt on a worker, whose result names its class.
    ddf = dd.from_pandas(FRAME, npartitions=2).persist()
    future = client.scatter(ddf)
    pd.testing.assert_frame_equal(future.result().compute(), FRAME)
    assert future.type is dd.DataFrame
    assert client.scatter(FRAME).type is pd.DataFrame  # known here before it is stored
    part = client.submit(lambda df: df.v, FRAME)
    assert part.result() is not None and part.type is pd.Series
    # Another future of the key, made later, is told the type as well.
    assert Future(part.key, client).type is pd.Series


def _slow_true() -> bool:
    threading.Event().wait(0.3)
    return True


def test_future_type_on_an_asynchronous_client(cluster: InMemoryCluster) -> None:
    async def types() -> tuple[Any, Any, Any]:
        async with Client(cluster.address, asynchronous=True) as ac:
            slow = ac.submit(_slow_true)
            before = slow.type
            await slow
            frame = await ac.scatter(FRAME)
            return before, slow.type, frame.type

    assert asyncio.run(types()) == (None, bool, pd.DataFrame)
