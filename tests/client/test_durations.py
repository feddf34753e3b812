"""Timeouts as Dask's users write them, wherever a timeout is taken."""

from __future__ import annotations

import datetime

import pytest

from apportion import (
    Client,
    Event,
    LocalCluster,
    Lock,
    Queue,
    Semaphore,
    Variable,
    as_completed,
    wait,
)
from apportion.core.durations import seconds
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (30, 30.0),
        (1.5, 1.5),
        ("30", 30.0),
        ("30s", 30.0),
        ("100 ms", 0.1),
        ("2 minutes", 120.0),
        ("1h", 3600.0),
        ("1.5 days", 129600.0),
        (datetime.timedelta(seconds=90), 90.0),
        (None, None),
    ],
)
def test_durations_read_as_dask_writes_them(given: object, expected: float | None) -> None:
    assert seconds(given) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("given", ["soon", "10 parsecs", "-5s", True, [1]])
def test_anything_else_is_a_clear_error(given: object) -> None:
    with pytest.raises(ValueError, match="timeout="):
        seconds(given)  # type: ignore[arg-type]


@pytest.mark.tcp
def test_dask_style_timeouts_are_taken_everywhere() -> None:
    with LocalCluster(n_workers=1, processes=False, timeout="30s") as cluster:
        with Client(cluster, timeout="10s") as client:
            assert client.timeout == 10.0
            future = client.submit(sum, [1, 2])
            assert future.result(timeout="5s") == 3
            wait([future], timeout="1 minute")
            assert list(as_completed([future], timeout="5s")) == [future]
            client.wait_for_workers(1, timeout="5s")
            cluster.wait_for_workers(1, timeout="5s")
            cluster.scale(1, timeout="30s")
            [scattered] = client.scatter([1], timeout="5s")
            assert scattered.result() == 1
        with pytest.raises(ValueError, match="Client timeout='soon' is not a duration"):
            Client(cluster, timeout="soon")
        cluster.close(timeout="5s")


def test_every_client_timeout_takes_dask_durations() -> None:
    with InMemoryCluster([{"nthreads": 1}]) as cluster, checked_client(cluster) as client:
        executor = client.get_executor()
        assert list(executor.map(abs, [-1, -2], timeout="10s")) == [1, 2]
        lock = Lock("durations")
        assert lock.acquire(timeout="1s")
        assert not Lock("durations").acquire(timeout="20ms")
        lock.release()
        semaphore = Semaphore(1, "durations-sem")
        assert semaphore.acquire(timeout="0s")
        semaphore.release()
        assert not Event("durations-event").wait(timeout="20 ms")
        with pytest.raises(TimeoutError):
            Variable("durations-var").get(timeout="20ms")
        with pytest.raises(TimeoutError):
            Queue("durations-queue").get(timeout="20ms")
        future = client.submit(abs, -3)
        assert future.result(timeout="10s") == 3
        assert client.gather([future]) == [3]
        client.restart(timeout="15s")
        assert client.submit(abs, -4).result(timeout="10s") == 4
        with pytest.raises(ValueError, match="timeout='fortnight' is not a duration"):
            client.restart(timeout="fortnight")
        with pytest.raises(ValueError, match="unknown unit 'parsecs'"):
            lock.acquire(timeout="3 parsecs")
        with pytest.raises(ValueError, match="is not a duration"):
            list(executor.map(abs, [1], timeout="later"))
