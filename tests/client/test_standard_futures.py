"""apportion futures in the standard library's own functions: ``concurrent.futures.wait``
and ``as_completed`` and ``asyncio.wrap_future`` (Dask's futures fail in all three,
dask/distributed#3695)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import weakref
from collections.abc import Iterator

import pytest

from apportion import Client, Future
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client

#: Tasks run in this process: each test sets this to let its waiting tasks end.
GATE = threading.Event()


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"nthreads": 4}]) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    GATE.clear()
    with checked_client(cluster) as c:
        try:
            yield c
        finally:
            GATE.set()  # before the client leaves: its tasks end, the cluster settles


def gated(x: int) -> int:
    GATE.wait(20)
    return x


def at_once(x: int) -> int:
    return x


def fails(x: int) -> int:
    raise ValueError(f"no {x}")


def test_an_apportion_future_is_a_standard_future(client: Client) -> None:
    future = client.submit(at_once, 1)
    assert isinstance(future, cf.Future)
    assert future.result(timeout=5) == 1
    assert not future.running()
    # Its task settles it; the executor's side of the standard future is not for use.
    with pytest.raises(RuntimeError, match="settled by its task"):
        future.set_result(2)
    with pytest.raises(RuntimeError, match="settled by its task"):
        future.set_exception(ValueError())


def test_wait_all_completed_returns_once_every_task_has(client: Client) -> None:
    futures = [client.submit(at_once, i) for i in range(3)] + [client.submit(gated, 9)]
    threading.Timer(0.2, GATE.set).start()
    done, not_done = cf.wait(futures, timeout=10)
    assert done == set(futures) and not not_done
    assert sorted(f.result() for f in done) == [0, 1, 2, 9]


def test_wait_first_completed_and_a_timeout(client: Client) -> None:
    slow = client.submit(gated, 1)
    quick = client.submit(at_once, 2)
    done, not_done = cf.wait([slow, quick], return_when=cf.FIRST_COMPLETED, timeout=10)
    assert done == {quick} and not_done == {slow}
    done, not_done = cf.wait([slow], timeout=0.1)
    assert not done and not_done == {slow}


def test_wait_first_exception_returns_on_a_failure(client: Client) -> None:
    slow = client.submit(gated, 1)
    bad = client.submit(fails, 2)
    done, not_done = cf.wait([slow, bad], return_when=cf.FIRST_EXCEPTION, timeout=10)
    assert done == {bad} and not_done == {slow}
    assert isinstance(bad.exception(), ValueError)


def test_wait_takes_apportion_and_thread_pool_futures_together(client: Client) -> None:
    with cf.ThreadPoolExecutor(1) as pool:
        local = pool.submit(GATE.wait, 20)
        remote = client.submit(at_once, 5)
        done, _ = cf.wait([local, remote], return_when=cf.FIRST_COMPLETED, timeout=10)
        assert done == {remote}
        GATE.set()
        done, not_done = cf.wait([local, remote], timeout=10)
        assert done == {local, remote} and not not_done


def test_as_completed_yields_in_the_order_tasks_end(client: Client) -> None:
    slow = client.submit(gated, 1)
    quick = [client.submit(at_once, i) for i in range(3)]
    order = []
    for future in cf.as_completed([slow, *quick], timeout=10):
        order.append(future)
        if len(order) == 3:
            GATE.set()  # the slow one may end only once the quick ones were yielded
    assert set(order[:3]) == set(quick) and order[3] is slow


def test_as_completed_yields_a_cancelled_future_and_raises_on_timeout(client: Client) -> None:
    slow = client.submit(gated, 1, pure=False)
    doomed = client.submit(gated, 2, pure=False)
    doomed.cancel()
    seen = []
    with pytest.raises(cf.TimeoutError):
        for future in cf.as_completed([slow, doomed], timeout=0.5):
            seen.append(future)
    assert seen == [doomed] and doomed.cancelled()


def test_a_future_dropped_while_waited_for_is_not_kept_alive(client: Client) -> None:
    future = client.submit(gated, 1, pure=False)
    cf.wait([future], timeout=0.05)  # its waiting parts exist now, following its key
    ref = weakref.ref(future)
    del future
    assert ref() is None  # no cycle: gone at once, not at the next garbage collection


def test_asyncio_wrap_future_gives_the_result_or_the_exception(client: Client) -> None:
    async def main() -> tuple[int, str]:
        value = await asyncio.wrap_future(client.submit(gated, 7))
        try:
            await asyncio.wrap_future(client.submit(fails, 3))
        except ValueError as exc:
            return value, str(exc)
        return value, "no exception"

    threading.Timer(0.1, GATE.set).start()
    assert asyncio.run(main()) == (7, "no 3")


def test_cancelling_the_asyncio_side_cancels_the_task(client: Client) -> None:
    future = client.submit(gated, 1, pure=False)

    async def main() -> None:
        wrapped = asyncio.wrap_future(future)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(wrapped, 0.1)  # cancels ``wrapped`` at the timeout

    asyncio.run(main())
    cf.wait([future], timeout=5)
    assert future.cancelled()


def test_wrap_future_of_an_asynchronous_clients_future_says_to_await_it(
    cluster: InMemoryCluster,
) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            future: Future = client.submit(at_once, 1)
            with pytest.raises(TypeError, match=r"awaited directly \(await future\)"):
                asyncio.wrap_future(future)
            assert await future == 1

    asyncio.run(main())
