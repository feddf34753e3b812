"""Guild's GPU example, executed for real: optimal in both submission orders.

One worker with ``gpu0=1 gpu1=1``; aaa(gpu0), bbb(gpu0), ccc(gpu0+gpu1), ddd(gpu1).
Guild's own spec shows Dask serialising ddd behind the gpu0 runs. Here ddd runs
alongside aaa, and the whole takes three task lengths, whichever order they come in.
Asserted from the start and end times the tasks record, not from wall-clock limits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster

REQUESTS = {"aaa": "gpu0=1", "bbb": "gpu0=1", "ccc": "gpu0=1 gpu1=1", "ddd": "gpu1=1"}


def run(name: str) -> tuple[str, float, float]:
    start = time.monotonic()
    time.sleep(0.3)
    return name, start, time.monotonic()


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    workers = [{"name": "gpus", "nthreads": 4, "resources": "gpu0=1 gpu1=1"}]
    with LocalCluster(workers=workers, processes=False) as cluster, Client(cluster) as c:
        yield c


@pytest.mark.tcp
@pytest.mark.parametrize("order", [["aaa", "bbb", "ccc", "ddd"], ["aaa", "ddd", "bbb", "ccc"]])
def test_guild_gpu_example_takes_three_lengths(client: Client, order: list[str]) -> None:
    futures = [client.submit(run, name, resources=REQUESTS[name], pure=False) for name in order]
    times = {name: (start, end) for name, start, end in client.gather(futures)}
    aaa, bbb, ccc, ddd = (times[k] for k in ("aaa", "bbb", "ccc", "ddd"))
    assert ddd[0] < aaa[1], "ddd must run alongside aaa"
    assert bbb[0] >= aaa[1], "bbb waits for gpu0"
    assert ccc[0] >= bbb[1] and ccc[0] >= ddd[1], "ccc needs both GPUs"
    # Three phases: {aaa, ddd}, {bbb}, {ccc}. ccc starts before anything else ends
    # after bbb, so no fourth phase exists: ccc starts as bbb ends, not later.
    assert ccc[0] < bbb[1] + (bbb[1] - bbb[0]), "ccc started a whole length late"
    assert bbb[0] < aaa[1] + (aaa[1] - aaa[0]), "bbb started a whole length late"
