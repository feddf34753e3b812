"""Asynchronous clients: awaited from the caller's loop, never blocking it, and the
blocking API unchanged beside them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from apportion import (
    Client,
    FutureCancelledError,
    LocalCluster,
    LostDataError,
    as_completed,
    wait,
)
from apportion.scheduler.invariants import check_invariants
from apportion.testing import InMemoryCluster


def inc(x: int) -> int:
    return x + 1


def div(x: float, y: float) -> float:
    return x / y


def sleepy(x: Any, delay: float) -> Any:
    time.sleep(delay)
    return x


def released_threads(before: set[threading.Thread], timeout: float = 5.0) -> list[str]:
    """Threads started since ``before`` and still alive after ``timeout`` (threads
    stopped by a close may take a moment to end; none may stay)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def _no_threads_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    assert released_threads(before) == []


@pytest.fixture
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"name": "a", "nthreads": 2}, {"name": "b", "nthreads": 2}]) as c:
        yield c
        check_invariants(c.scheduler.state)


def run(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a test's coroutine in a loop of its own, as a service would."""
    return asyncio.run(asyncio.wait_for(make(), 30))


def test_awaited_calls_give_what_the_blocking_ones_return(cluster: InMemoryCluster) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            assert client.asynchronous
            future = client.submit(inc, 10)  # a future at once
            assert await future == 11
            assert await future.result() == 11  # Dask's result() is awaitable too
            assert await client.gather(client.map(inc, range(5))) == [1, 2, 3, 4, 5]
            assert await client.gather({"x": future, "y": [future]}) == {"x": 11, "y": [11]}
            [x] = await client.scatter([41])
            assert await client.submit(inc, x) == 42
            assert await client.scatter([]) == []
            done, not_done = await wait(client.map(inc, range(3)))
            assert len(done) == 3 and not not_done
            info = await client.scheduler_info()  # fetched afresh
            assert len(info["workers"]) == 2
            assert client.scheduler_info()["type"] == "Scheduler"  # the copy, as Dask's
            await client.wait_for_workers(2)
            assert sorted((await client.run(inc, 1)).values()) == [2, 2]
            holders = await client.who_has(future)
            assert list(holders) == [future.key] and len(holders[future.key]) == 1
            await client.publish_dataset(answer=future)
            assert await client.list_datasets() == ["answer"]
            assert await (await client.get_dataset("answer")) == 11
            await client.unpublish_dataset("answer")
            await client.set_metadata(["a", "b"], 1)
            assert await client.get_metadata(["a"]) == {"b": 1}
            assert len(await client.story(future)) > 0

    run(main)


def test_as_completed_is_an_async_iterator(cluster: InMemoryCluster) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            got = [await future async for future in as_completed(client.map(inc, range(5)))]
            assert sorted(got) == [1, 2, 3, 4, 5]
            done = client.submit(inc, 100)
            await done  # finished before the iterator sees it
            pairs = as_completed([done, client.submit(div, 1, 0)], with_results=True)
            pairs.add(client.submit(inc, 7))
            seen = []
            with pytest.raises(ZeroDivisionError):
                async for _, value in pairs:
                    seen.append(value)
            async for _, value in pairs:  # the rest, once the failure was raised
                seen.append(value)
            assert sorted(seen) == [8, 101]
            with pytest.raises(RuntimeError, match="async for"):
                next(as_completed([client.submit(inc, 1)]))  # would block the loop

    run(main)


def test_a_failed_task_raises_when_awaited_and_cancel_is_awaitable(
    cluster: InMemoryCluster,
) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            erred = client.submit(div, 1, 0)
            with pytest.raises(ZeroDivisionError):
                await erred
            with pytest.raises(ZeroDivisionError):
                await client.gather([erred])
            assert isinstance(await erred.exception(), ZeroDivisionError)
            assert await client.gather([erred, client.submit(inc, 1)], errors="skip") == [2]
            slow = client.submit(sleepy, 1, 2.0)
            await client.cancel(slow)
            with pytest.raises(FutureCancelledError):
                await slow
            await slow.cancel()  # again, through the future: nothing left to do

    run(main)


def test_a_timed_out_gather_leaves_the_client_usable(cluster: InMemoryCluster) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            slow = client.submit(sleepy, 1, 1.0)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.gather(slow), 0.05)
            with pytest.raises(TimeoutError):
                await slow.result(timeout=0.05)
            assert await client.submit(inc, 1) == 2
            assert await slow == 1  # the timed-out wait took nothing from it

    run(main)


def test_closing_fails_pending_awaits_at_once(cluster: InMemoryCluster) -> None:
    async def main() -> None:
        client = await Client(cluster.address, asynchronous=True)
        slow = client.submit(sleepy, 1, 2.0)  # its thread ends before the test's
        waiting = [
            asyncio.ensure_future(client.gather(slow)),
            asyncio.ensure_future(slow.result()),
            asyncio.ensure_future(wait(slow)),
        ]
        await asyncio.sleep(0)  # each starts, and then waits on the client's loop
        started = time.monotonic()
        await client.close()
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        assert time.monotonic() - started < 5.0
        for outcome in outcomes[:2]:
            assert isinstance(outcome, LostDataError) and "closed" in str(outcome), outcome
        assert not isinstance(outcomes[2], BaseException)  # wait: done, as lost
        assert slow.status == "lost"
        await client.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            client.submit(inc, 1)

    run(main)


def test_datasets_of_an_asynchronous_client_are_awaited(cluster: InMemoryCluster) -> None:
    """Dask's test_datasets_async: get and iterate awaited; what Python cannot await
    is a TypeError saying what to await instead."""

    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            await client.publish_dataset(foo=1, bar=2)
            assert await client.datasets["foo"] == 1
            assert await client.datasets.get("nope", "fallback") == "fallback"
            assert {name async for name in client.datasets} == {"foo", "bar"}
            with pytest.raises(TypeError, match="publish_dataset"):
                client.datasets["baz"] = 3
            with pytest.raises(TypeError, match="unpublish_dataset"):
                del client.datasets["foo"]
            with pytest.raises(TypeError, match="'async for'"):
                next(iter(client.datasets))
            with pytest.raises(TypeError, match="list_datasets"):
                len(client.datasets)
            with pytest.raises(TypeError, match="list_datasets"):
                _ = "foo" in client.datasets
            # From a thread without a loop, the same client blocks, as Dask's does.
            assert await asyncio.to_thread(lambda: sorted(client.datasets)) == ["bar", "foo"]
            await client.unpublish_dataset(["foo", "bar"])

    run(main)


def test_calls_that_would_block_the_loop_say_what_to_do(cluster: InMemoryCluster) -> None:
    dask = pytest.importorskip("dask")

    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            with pytest.raises(TypeError, match=r"await client\.publish_dataset"):
                client.datasets["x"] = 1
            with pytest.raises(RuntimeError, match=r"await client\.compute\(x\)"):
                dask.delayed(inc)(1).compute()
            assert await client.compute(dask.delayed(inc)(1)) == 2
            assert await client.compute(dask.delayed(inc)(2), sync=True) == 3
            with pytest.raises(RuntimeError, match="would block the running event loop"):
                client.gather(client.submit(inc, 1), asynchronous=False)
            # From a thread without a loop, the same client blocks, as Dask's does.
            assert await asyncio.to_thread(lambda: client.submit(inc, 3).result()) == 4
            assert await asyncio.to_thread(dask.delayed(inc)(4).compute) == 5

    run(main)


def test_sync_runs_a_coroutine_function_or_a_plain_one(cluster: InMemoryCluster) -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def slow() -> None:
        await asyncio.sleep(5)

    with Client(cluster.address) as blocking:
        assert blocking.sync(double, 4) == 8  # on the client's own loop
        assert blocking.sync(inc, 1) == 2
        with pytest.raises(TimeoutError):
            blocking.sync(slow, callback_timeout="50ms")

    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            assert await client.sync(double, 5) == 10  # in this loop
            assert client.sync(inc, 1) == 2  # a plain value as it is, as in Dask
            with pytest.raises(TimeoutError):
                await client.sync(slow, callback_timeout=0.05)

    run(main)


def test_a_blocking_clients_sync_runs_a_coroutine_that_awaits_the_client(
    cluster: InMemoryCluster,
) -> None:
    """Dask's "evolving workflows": inside ``client.sync(coroutine_function)`` a
    blocking client's calls are awaited, since the coroutine runs on the client's own
    loop (Dask's ``asynchronous`` is true there)."""

    async def evolving(client: Client) -> dict[str, Any]:
        assert client.asynchronous
        futures = client.map(inc, range(4))  # futures at once, as ever
        seen = []
        results = as_completed(futures, with_results=True)
        async for _, value in results:
            seen.append(value)
            if value < 6:
                results.add(client.submit(inc, value + 2))
        await wait(futures)
        [data] = await client.scatter([10])
        return {
            "seen": sorted(seen),
            "gathered": await client.gather(futures),
            "awaited": await client.submit(inc, data),
            "result": await client.submit(inc, 1).result(),
            "exception": type(await client.submit(div, 1, 0).exception()).__name__,
            "plain iteration": _refused(lambda: next(as_completed([client.submit(inc, 2)]))),
        }

    with Client(cluster.address) as client:
        got = client.sync(evolving, client)
        assert not client.asynchronous  # on the user's thread, blocking as ever
        assert client.submit(inc, 1).result() == 2
    assert got == {
        "seen": [1, 2, 3, 4, 4, 5, 6, 7, 7, 8],  # each below 6 added v + 3
        "gathered": [1, 2, 3, 4],
        "awaited": 11,
        "result": 2,
        "exception": "ZeroDivisionError",
        "plain iteration": "RuntimeError",
    }


def test_dasks_compute_inside_a_blocking_clients_sync_says_to_await(
    cluster: InMemoryCluster,
) -> None:
    dask = pytest.importorskip("dask")

    async def compute_there(client: Client) -> Any:
        with pytest.raises(RuntimeError, match="called from its own loop, as in client"):
            dask.delayed(inc)(1).compute()
        return await client.compute(dask.delayed(inc)(1))

    with Client(cluster.address) as client:
        assert client.sync(compute_there, client) == 2


def _refused(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__
    return "not refused"


def test_a_blocking_client_works_beside_an_asynchronous_one(cluster: InMemoryCluster) -> None:
    blocking = Client(cluster.address, set_as_default=False)

    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            # Blocking calls from inside the running loop keep working, as in Dask.
            assert blocking.submit(inc, 1).result() == 2
            assert not blocking.asynchronous
            # And from a thread, while this loop awaits its own client's work.
            from_thread = asyncio.to_thread(lambda: blocking.gather(blocking.map(inc, range(50))))
            awaited = client.gather(client.map(inc, range(50, 100)))
            a, b = await asyncio.gather(from_thread, awaited)
            assert a + b == list(range(1, 101))

    try:
        run(main)
    finally:
        blocking.close()


def test_wait_and_futures_of_an_unconnected_client_say_to_await_it() -> None:
    client = Client("inproc://nowhere", asynchronous=True)
    with pytest.raises(RuntimeError, match="await it first"):
        client.submit(inc, 1)

    async def main() -> None:
        await client.close()  # never connected: nothing to do

    run(main)


@pytest.mark.tcp
def test_an_embedded_cluster_and_a_local_cluster_start_and_stop_awaited() -> None:
    async def main() -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        beat = asyncio.create_task(ticker())
        async with Client(asynchronous=True, processes=False, n_workers=1) as client:
            assert await client.submit(inc, 1) == 2
            assert client.cluster is not None and client.cluster.asynchronous
        assert client.cluster._closed
        async with LocalCluster(asynchronous=True, processes=False, n_workers=1) as cluster:
            await cluster.wait_for_workers(1)
            async with Client(cluster, asynchronous=True) as client:
                assert await client.submit(inc, 2) == 3
                await cluster.scale(2)
                assert len((await client.scheduler_info())["workers"]) == 2
                assert len((await client.scheduler_info(n_workers=1))["workers"]) == 1
        cluster = await LocalCluster(asynchronous=True, processes=False, n_workers=1)
        client = await Client(cluster, asynchronous=True)
        assert await client.submit(inc, 3) == 4
        await client.shutdown()  # the client, then its cluster
        assert cluster._closed
        beat.cancel()
        assert ticks > 5  # the loop ran on while clusters started and stopped

    run(main)


def test_as_current_makes_a_client_the_current_one_within_its_block(
    cluster: InMemoryCluster,
) -> None:
    with Client(cluster.address) as first, Client(cluster.address, set_as_default=False) as other:
        assert Client.current() is first
        with other.as_current():
            assert Client.current() is other

            async def in_a_task() -> Client:
                return Client.current()  # a task of this context sees it too

            assert asyncio.run(in_a_task()) is other
        assert Client.current() is first
