"""Timeouts as Dask's users write them, wherever a timeout is taken."""

from __future__ import annotations

import datetime

import pytest

from apportion import Client, LocalCluster, as_completed, wait
from apportion.core.durations import seconds


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
            [scattered] = client.scatter([1], timeout="5s")
            assert scattered.result() == 1
        with pytest.raises(ValueError, match="Client timeout='soon' is not a duration"):
            Client(cluster, timeout="soon")
