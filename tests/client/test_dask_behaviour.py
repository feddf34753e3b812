"""Behaviours Dask.distributed's own tests check of its public API, on apportion:
scattering a persisted collection, a persisted graph of futures, short tracebacks,
``get_scheduler()`` inside ``with client:`` and inside tasks, the client inside a
task, ``cluster.get_client()``, the dashboard link setting, ``death_timeout``, and
``with client:`` left on another thread. In memory unless a real cluster is the
point (marked ``tcp``/``process``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import operator
import sys
import time
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import cloudpickle
import dask
import dask.base
import dask.dataframe as dd
import pandas as pd
import pytest

from apportion import Client, LocalCluster, Worker, futures_of, get_client, worker_client
from apportion.client import dask_default
from apportion.net.security import Security
from apportion.testing import InMemoryCluster
from cli_processes import Processes, poll
from cluster_checks import checked_client

pytestmark = pytest.mark.timeout(60)

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

FRAME = pd.DataFrame({"x": [1, 2, 3], "y": [1.0, 2.0, 3.0]})


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(workers=[{"name": "a", "nthreads": 2}, {"name": "b", "nthreads": 2}]) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


def div(x: float, y: float) -> float:
    return x / y


def user_frames(tb: TracebackType | None) -> list[tuple[str, str]]:
    return [(frame.filename, frame.name) for frame in traceback.extract_tb(tb)]


def computes_equal(frame: Any, expected: pd.DataFrame) -> bool:
    pd.testing.assert_frame_equal(frame.compute(), expected)
    return True


# --- scatter of a persisted collection; its graph of futures ---------------------------


def scatters_a_persisted_frame(client: Client) -> None:
    persisted = client.persist(dd.from_pandas(FRAME, npartitions=2))
    future = client.scatter(persisted)
    again = future.result()
    assert isinstance(again, dd.DataFrame)
    pd.testing.assert_frame_equal(again.compute(), FRAME)
    assert client.submit(computes_equal, future, FRAME).result()
    # The persisted collection itself, as a task's argument, computes there too.
    assert client.submit(computes_equal, persisted, FRAME, pure=False).result()
    # Mixed with plain values, in a list: each keeps its place.
    many = client.scatter([persisted, 5])
    back = client.gather(many)
    assert back[1] == 5 and isinstance(back[0], dd.DataFrame)


def test_a_persisted_frame_scatters_and_computes_again(client: Client) -> None:
    scatters_a_persisted_frame(client)


def test_a_persisted_frame_scatters_from_an_asynchronous_client(cluster: InMemoryCluster) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            persisted = client.persist(dd.from_pandas(FRAME, npartitions=2))
            future = await client.scatter(persisted)
            again = await future
            pd.testing.assert_frame_equal(await client.compute(again), FRAME)

    asyncio.run(main())


def test_a_persisted_graph_holds_the_futures_themselves(client: Client) -> None:
    persisted = client.persist(dd.from_pandas(FRAME, npartitions=3))
    parts = [v for v in dict(persisted.__dask_graph__()).values() if not hasattr(v, "target")]
    assert len(parts) == 3 and set(parts) == set(futures_of(persisted))
    assert all(part.client is client for part in parts)
    # Built on, the collection starts from those parts.
    assert int((persisted.x + 1).sum().compute()) == 9


# --- tracebacks of task failures --------------------------------------------------------


def assert_short(tb: TracebackType | None) -> None:
    frames = user_frames(tb)
    assert len(frames) < 4, frames  # Dask's test_short_tracebacks
    # The failing line itself (by number: this module travels by value, as a
    # script's functions do, so its frames have no file to read the line from).
    assert traceback.extract_tb(tb)[-1][1:3] == (div.__code__.co_firstlineno + 1, "div")
    inner = [name for name, _ in frames[1:]]
    assert not any("scheduler" in n or "worker" in n or "concurrent" in n for n in inner)


def test_task_tracebacks_show_the_users_frames_blocking(client: Client) -> None:
    future = client.submit(div, 1, 0)
    # Each called straight from here: a lambda would add a frame of its own.
    with pytest.raises(ZeroDivisionError) as info:
        future.result()
    assert_short(info.value.__traceback__)
    with pytest.raises(ZeroDivisionError) as info:
        client.gather(future)
    assert_short(info.value.__traceback__)
    with pytest.raises(ZeroDivisionError) as info:
        client.gather([future])
    assert_short(info.value.__traceback__)
    with pytest.raises(ZeroDivisionError) as info:
        client.get({"x": (div, 1, 0)}, "x")
    assert_short(info.value.__traceback__)
    tb = future.traceback()
    assert [name for _, name in user_frames(tb)] == ["div"]
    # A dependent fails with its input's exception, and traceback.
    assert user_frames(client.submit(operator.neg, future).traceback()) == user_frames(tb)


def test_task_tracebacks_show_the_users_frames_asynchronous(cluster: InMemoryCluster) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            future = client.submit(div, 1, 0)
            with pytest.raises(ZeroDivisionError) as info:
                await future
            assert_short(info.value.__traceback__)
            with pytest.raises(ZeroDivisionError) as info:
                await future.result()
            assert_short(info.value.__traceback__)
            with pytest.raises(ZeroDivisionError) as info:
                await client.gather(future)
            assert_short(info.value.__traceback__)
            assert [name for _, name in user_frames(await future.traceback())] == ["div"]

    asyncio.run(main())


# --- Dask's scheduler: the current client's get ------------------------------------------


def test_get_scheduler_is_the_clients_get_inside_with_and_the_previous_one_after(
    cluster: InMemoryCluster,
) -> None:
    before = dask.base.get_scheduler()
    with Client(cluster.address) as outer:
        assert dask.base.get_scheduler() == outer.get
        with Client(cluster.address) as inner:
            assert dask.base.get_scheduler() == inner.get
            with outer.as_current():
                assert dask.base.get_scheduler() == outer.get
        assert dask.base.get_scheduler() == outer.get
        with Client(cluster.address, set_as_default=False) as aside:
            assert dask.base.get_scheduler() != aside.get
            assert dask.base.get_scheduler() == outer.get
    assert dask.base.get_scheduler() == before
    older, newer = Client(cluster.address), Client(cluster.address)
    try:
        assert dask.base.get_scheduler() == newer.get  # the newest default client
        with older:  # entering makes the entered one current, as in Dask
            assert dask.base.get_scheduler() == older.get
            assert int(dask.delayed(operator.add)(1, 2).compute()) == 3
        assert dask.base.get_scheduler() == newer.get
    finally:
        newer.close()
        older.close()
    assert dask.base.get_scheduler() == before


def scheduler_is_worker_clients_get() -> bool:
    with worker_client() as client:
        return bool(dask.base.get_scheduler() == client.get)


def test_get_scheduler_inside_worker_client_is_the_workers_clients_get(client: Client) -> None:
    assert client.submit(scheduler_is_worker_clients_get, pure=False).result()
    # Elsewhere in a task, Dask's compute runs on the task's thread (README).
    assert client.submit(dask.base.get_scheduler, pure=False).result() is dask_default.get


def test_dasks_configuration_still_pickles_to_the_same_stand_in(client: Client) -> None:
    import pickle

    assert pickle.loads(pickle.dumps(dask.config.get("scheduler"))) is dask_default.CURRENT


# --- the client inside a task -------------------------------------------------------------


def direct_to_workers_here() -> Any:
    return get_client().direct_to_workers


def test_the_client_inside_a_task_goes_direct_to_workers(client: Client) -> None:
    assert not client.direct_to_workers
    assert client.submit(direct_to_workers_here, pure=False).result() is True


# --- leaving ``with client`` elsewhere --------------------------------------------------


def test_leaving_with_client_on_another_thread_raises_and_closes_it(
    cluster: InMemoryCluster,
) -> None:
    client = Client(cluster.address)
    with (
        concurrent.futures.ThreadPoolExecutor(1) as one,
        concurrent.futures.ThreadPoolExecutor(1) as other,
    ):
        one.submit(client.__enter__).result()
        with pytest.raises(ValueError, match="was created in a different Context"):
            other.submit(client.__exit__, None, None, None).result()
    assert client._closed  # closed all the same: nothing is left open


def test_leaving_async_with_in_another_task_raises(cluster: InMemoryCluster) -> None:
    async def main() -> None:
        client = Client(cluster.address, asynchronous=True)
        await asyncio.create_task(client.__aenter__())
        with pytest.raises(ValueError, match="was created in a different Context"):
            await asyncio.create_task(client.__aexit__(None, None, None))
        assert client._closed

    asyncio.run(main())


# --- a LocalCluster's current client, its dashboard link ---------------------------------


@pytest.mark.tcp
def test_cluster_get_client_gives_its_current_client_and_honours_the_link_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("USER", "myusername")
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        cluster.get_client() as first,
    ):
        assert first.cluster is cluster
        with Client(cluster) as second:
            assert second is not first
            assert cluster.get_client() is second
        assert cluster.get_client() is first
        # No setting: apportion's one-time login link, fresh on each access.
        login = first.dashboard_link
        assert login is not None and "/login?token=" in login
        assert first.dashboard_link != login and "/login?token=" in cluster.dashboard_link
        port = login.split("://")[1].split("/")[0].rsplit(":", 1)[1]
        template = "{scheme}://foo-{USER}:{port}/status"
        with dask.config.set({"distributed.dashboard.link": template}):
            expected = f"http://foo-myusername:{port}/status"
            assert first.dashboard_link == expected == cluster.dashboard_link
        with dask.config.set({"distributed.dashboard.link": "{host}"}):
            assert "/" not in first.dashboard_link
        with (
            dask.config.set({"distributed.dashboard.link": "{scheme}://{NOPE_X}/"}),
            pytest.raises(ValueError, match="NOPE_X"),
        ):
            first.dashboard_link  # noqa: B018 - the property is the call


def test_cluster_get_client_when_the_current_client_is_elsewhere(
    cluster: InMemoryCluster,
) -> None:
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=None) as local,
        Client(cluster.address),
    ):
        made = local.get_client()
        try:
            assert made.cluster is local
        finally:
            made.close()


# --- death_timeout -------------------------------------------------------------------------


def test_a_worker_that_cannot_reach_its_scheduler_gives_up_after_death_timeout() -> None:
    async def main() -> None:
        worker = Worker(
            "tcp://127.0.0.1:1",
            death_timeout="0.3s",
            security=Security(token="0123456789abcdef" * 4),
        )
        assert worker.connect_timeout == worker.reconnect_timeout == 0.3
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"gave up after 0\.3s"):  # as Dask's
            await worker.start()
        assert time.monotonic() - started < 5

    asyncio.run(main())


def test_a_local_clusters_death_timeout_reaches_its_workers() -> None:
    with LocalCluster(
        n_workers=1, processes=False, death_timeout="7s", dashboard_address=None
    ) as c:
        assert c.death_timeout == 7.0
        assert "--death-timeout" in c._command(
            {"nthreads": 1, "name": "w", "resources": {}, "units": {}}
        )
        (worker,) = c._workers
        assert worker.reconnect_timeout == 7.0
    with pytest.raises(ValueError, match="death_timeout"):
        LocalCluster(n_workers=0, processes=False, death_timeout="soon")
    # As Dask's servers, a cluster not started within it fails, and leaves nothing.
    with pytest.raises(TimeoutError, match="did not start within its death_timeout after 1e-10s"):
        LocalCluster(n_workers=1, processes=False, death_timeout=1e-10, dashboard_address=None)


# --- on CLI workers --------------------------------------------------------------------------


@pytest.mark.process
def test_the_behaviours_on_cli_workers(procs: Processes) -> None:
    with Client(procs.two_workers()) as client:
        client.wait_for_workers(2, timeout=30)
        scatters_a_persisted_frame(client)
        future = client.submit(div, 1, 0)
        with pytest.raises(ZeroDivisionError) as info:
            future.result()
        assert_short(info.value.__traceback__)
        assert client.submit(direct_to_workers_here, pure=False).result() is True
        assert client.submit(scheduler_is_worker_clients_get, pure=False).result()
        with client:
            assert dask.base.get_scheduler() == client.get


@pytest.mark.process
def test_a_cli_worker_exits_after_death_timeout_without_its_scheduler(procs: Processes) -> None:
    scheduler, address, _ = procs.start_scheduler("--port", "0")
    worker, log = procs.start("worker", address, "--nthreads", "1", "--death-timeout", "1s")
    with Client(address) as client:
        client.wait_for_workers(1, timeout=30)
    scheduler.kill()
    scheduler.wait()
    poll(lambda: worker.poll() is not None, 20, "the worker to exit")
    assert worker.returncode == 1, log.read_text()
