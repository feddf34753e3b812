"""A resource name that is a slip of an offered one fails at once, saying what was meant.

On an in-memory cluster both as a cluster that can grow (a remote scheduler's
setting) and as one that cannot (``Client()``'s and ``LocalCluster``'s): waiting
would be waiting for a worker that offers the misspelt name, on either.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterator

import dask
import pytest
from dask import delayed

from apportion import (
    Client,
    LocalCluster,
    UnknownResourceError,
    UnsatisfiableError,
)
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import InMemoryCluster

pytestmark = pytest.mark.timeout(30)

#: Well below any wait for a worker: the failure comes with the submission's answer.
AT_ONCE = 5.0


@pytest.fixture(scope="module", params=[False, True], ids=["can-grow", "cannot-grow"])
def cluster(request: pytest.FixtureRequest) -> Iterator[InMemoryCluster]:
    config = SchedulerConfig(fail_unsatisfiable=request.param)
    workers = [{"name": "gpu-a", "nthreads": 2, "resources": "GPU=2 MEMORY=4GiB"}]
    with InMemoryCluster(workers=workers, config=config) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with cluster.client() as c:
        yield c


@pytest.mark.parametrize("name", ["gpu", "GUP"])
def test_submit_names_the_resource_and_what_was_meant(client: Client, name: str) -> None:
    began = time.monotonic()
    future = client.submit(operator.neg, 1, resources={name: 1})
    with pytest.raises(UnknownResourceError) as caught:
        future.result(timeout=AT_ONCE)
    assert time.monotonic() - began < AT_ONCE
    text = str(caught.value)
    assert f"asks for {name}=1, but no connected worker offers {name}" in text
    assert f"did you mean GPU (not {name})?" in text
    assert "the workers offer GPU=2 on gpu-a, MEMORY=4 GiB on gpu-a" in text
    # A wrong request, and one nothing can run: code catching either sees it.
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, UnsatisfiableError)


def test_map_compute_and_persist_fail_the_same_way(client: Client) -> None:
    for future in client.map(operator.neg, [1, 2], resources="gpu=1"):
        with pytest.raises(UnknownResourceError, match="did you mean GPU"):
            future.result(timeout=AT_ONCE)
    graph = delayed(operator.add)(delayed(operator.neg)(1), 1)
    with pytest.raises(UnknownResourceError, match=r"did you mean MEMORY \(not memory\)"):
        client.compute(graph, resources={"memory": 1e9}).result(timeout=AT_ONCE)
    with dask.annotate(resources={"Gpu": 1}):
        annotated = delayed(operator.neg)(3)
    (persisted,) = client.persist([annotated])
    with pytest.raises(UnknownResourceError, match=r"did you mean GPU \(not Gpu\)"):
        client.compute(persisted).result(timeout=AT_ONCE)


def test_the_right_name_still_runs(client: Client) -> None:
    assert client.submit(operator.neg, 1, resources={"GPU": 1}).result(timeout=AT_ONCE) == -1


def test_an_embedded_local_cluster_says_it_too() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, resources="GPU=1") as cluster,
        Client(cluster) as client,
    ):
        future = client.submit(operator.neg, 1, resources={"gpu": 1})
        with pytest.raises(UnknownResourceError, match="did you mean GPU"):
            future.result(timeout=AT_ONCE)
