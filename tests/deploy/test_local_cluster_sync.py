"""``LocalCluster.sync`` as Dask's: a coroutine function or a plain one run on the
cluster's own loop for a blocking caller, an awaitable for an asynchronous one; and
``loop=`` given one of apportion's loops is taken without a word."""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster
from apportion.deploy.cluster_options import IgnoredOptionWarning, take_own_loop

pytestmark = pytest.mark.tcp


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as c:
        yield c


async def where_and_how(cluster: LocalCluster, x: int) -> tuple[int, bool, int]:
    await asyncio.sleep(0)
    return threading.get_ident(), cluster.asynchronous, x + 1


def test_a_coroutine_function_runs_on_the_cluster_s_loop(cluster: LocalCluster) -> None:
    ident, asynchronous, value = cluster.sync(where_and_how, cluster, x=1)
    assert value == 2
    assert ident != threading.get_ident()
    assert asynchronous  # there, the cluster's calls are awaited, as in Dask
    assert not cluster.asynchronous  # here they block


def test_a_plain_function_runs_there_too_and_a_timeout_is_kept(cluster: LocalCluster) -> None:
    assert cluster.sync(lambda: threading.get_ident()) != threading.get_ident()
    assert cluster.sync(len, [1, 2, 3]) == 3
    with pytest.raises(TimeoutError):
        cluster.sync(asyncio.sleep, 5, callback_timeout="50ms")
    with pytest.raises(ZeroDivisionError):
        cluster.sync(lambda: 1 / 0)


def test_an_asynchronous_cluster_gives_an_awaitable() -> None:
    async def main() -> None:
        async with LocalCluster(
            n_workers=0, processes=False, dashboard_address=None, asynchronous=True
        ) as cluster:
            awaitable = cluster.sync(where_and_how, cluster, 41)
            ident, asynchronous, value = await awaitable
            assert (ident, asynchronous, value) == (threading.get_ident(), True, 42)
            assert cluster.sync(len, "ab") == 2  # a plain function's value as it is
            with pytest.raises(TimeoutError):
                await cluster.sync(asyncio.sleep, 5, callback_timeout=0.05)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_loop_given_one_of_ours_is_taken_any_other_is_named(cluster: LocalCluster) -> None:
    with Client(cluster) as client:
        ours = {"loop": client.loop}
        take_own_loop(ours)
        assert ours == {}
        foreign = asyncio.new_event_loop()
        try:
            theirs = {"loop": foreign}
            take_own_loop(theirs)
            assert theirs == {"loop": foreign}
            with pytest.warns(IgnoredOptionWarning, match="loop"):
                Client(cluster.scheduler_address, loop=foreign).close()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with LocalCluster(
                    n_workers=0, processes=False, dashboard_address=None, loop=client.loop
                ):
                    pass
        finally:
            foreign.close()
