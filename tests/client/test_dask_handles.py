"""Dask's names for looking into a client and its tasks: ``scheduler.address``,
``loop``, ``futures``, ``nbytes``, ``normalize_collection``, ``dump_cluster_state``
and running a task here under a debugger (``recreate_error_locally``,
``recreate_task_locally``); blocking and asynchronous clients of an in-memory
cluster."""

from __future__ import annotations

import asyncio
import gzip
import io
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml

from apportion import Client, Event, get_worker, progress, wait
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"name": "a", "nthreads": 1}, {"name": "b", "nthreads": 1}]) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


def inc(x: int) -> int:
    return x + 1


def dec(x: int) -> int:
    return x - 1


def div(x: float, y: float) -> float:
    return x / y


def double(x: int) -> int:
    return 2 * x


#: Which thread a task ran on, by its argument.
RAN_ON: dict[Any, int] = {}


def noting_thread(x: Any) -> Any:
    RAN_ON[x] = threading.get_ident()
    return x


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


# --- scheduler, loop, futures -----------------------------------------------------------


def test_scheduler_address_on_the_client_and_in_a_task(
    cluster: InMemoryCluster, client: Client
) -> None:
    assert client.scheduler.address == cluster.address == client.scheduler_address
    assert cluster.address in repr(client.scheduler)
    assert client.submit(lambda: get_worker().scheduler.address).result() == cluster.address
    with pytest.raises(AttributeError, match=r"only \.address.*client\.nbytes\(\)"):
        client.scheduler.nbytes  # noqa: B018  (Dask's handler, not served here)


def test_loop_is_the_client_s_own_and_is_taken_back_as_loop(
    cluster: InMemoryCluster, client: Client
) -> None:
    loop = client.loop
    assert isinstance(loop, asyncio.AbstractEventLoop) and loop.is_running()
    assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "here"), loop).result(5) == "here"
    x = client.submit(inc, 1)
    progress(x, loop=client.loop, file=io.StringIO())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn of: it is one of ours
        with Client(cluster.address, loop=client.loop) as other:
            assert other.submit(inc, 2).result() == 3


def test_futures_are_the_live_ones_by_key(client: Client) -> None:
    ok = client.submit(inc, 1)
    bad = client.submit(div, 1, 0)
    wait([ok, bad])
    states = client.futures
    assert set(states) == {ok.key, bad.key}
    assert states[ok.key].status == "finished" and states[ok.key].exception is None
    assert "finished" in repr(states[ok.key])
    assert isinstance(states[bad.key].exception, ZeroDivisionError)
    assert states[bad.key].traceback is not None and states[bad.key].done()
    bad.release()
    assert bad.key not in client.futures


def test_a_get_that_raised_holds_none_of_its_futures(client: Client) -> None:
    """As Dask's: the first failure is raised at once, and the keys still running are
    released with the get's futures, not kept wanted by what waited for them."""
    release = Event()
    with pytest.raises(ZeroDivisionError):
        client.get({"x": (div, 1, 0), "y": (release.wait, 10)}, ["x", "y"])
    assert client.futures == {}
    release.set()


# --- nbytes ------------------------------------------------------------------------------


def test_nbytes_per_key_and_by_task_group(client: Client) -> None:
    incs = client.map(inc, [1, 2, 3])
    doubles = client.map(double, [1, 2, 3])
    wait(incs + doubles)
    one = 28  # sys.getsizeof(1)
    assert client.nbytes(summary=False) == {f.key: one for f in incs + doubles}
    assert client.nbytes() == {"inc": 3 * one, "double": 3 * one}
    assert client.nbytes(keys=[incs[0].key], summary=False) == {incs[0].key: one}
    assert client.nbytes(doubles[:2]) == {"double": 2 * one}  # futures, summed


# --- normalize_collection ---------------------------------------------------------------


def test_normalize_collection_takes_held_parts_from_their_futures(client: Client) -> None:
    from dask import delayed

    from apportion import Future

    x = delayed(inc)(1)
    y = delayed(inc)(x)
    z = delayed(inc)(y)
    yy = client.persist(y)
    zz = client.normalize_collection(z)
    assert len(z.dask) == 3  # unchanged
    assert isinstance(zz.dask[y.key], Future) and len(zz.dask) == 2
    assert client.compute(zz).result() == 4
    assert client.normalize_collection(x) is x  # nothing held in common
    del yy


def test_normalize_collection_of_a_dask_array(client: Client) -> None:
    da = pytest.importorskip("dask.array")
    y = da.ones(10, chunks=(5,)) + 1
    yy = client.persist(y)
    z = y.sum()
    graph = dict(z.dask)
    zz = client.normalize_collection(z)
    assert dict(z.dask) == graph and len(zz.dask) < len(graph)
    assert client.compute(zz).result() == client.compute(z).result() == 20
    first = y.__dask_keys__()[0]  # a tuple key: ('add-...', 0)
    assert client.recreate_task_locally(first).tolist() == [2.0] * 5
    del yy


# --- running a task here --------------------------------------------------------------


def test_recreate_error_locally_runs_the_failed_input_here(client: Client) -> None:
    x0 = client.submit(dec, 2)
    y0 = client.submit(dec, 1)
    x = client.submit(div, 1, x0)
    y = client.submit(div, 1, y0)  # 1 / 0
    f = client.submit(sum, [x, y])
    wait(f)
    assert f.status == "error"
    with pytest.raises(ZeroDivisionError) as raised:
        client.recreate_error_locally(f)
    assert "div" in [frame.name for frame in raised.traceback]  # raised here, in div
    assert f.status == "error"


def test_recreate_error_locally_of_nothing_failed_is_a_value_error(client: Client) -> None:
    with pytest.raises(ValueError, match="No errored futures passed"):
        client.recreate_error_locally(client.submit(dec, 2))


def test_recreate_task_locally_runs_in_this_thread_with_inputs_fetched(client: Client) -> None:
    x = client.submit(dec, 2)
    y = client.submit(dec, 2)
    f = client.submit(sum, [client.submit(div, 1, x), client.submit(div, 1, y)])
    assert client.recreate_task_locally(f) == 2
    marker = "sync-here"
    g = client.submit(noting_thread, marker)
    assert client.recreate_task_locally(g) == marker
    assert RAN_ON[marker] == threading.get_ident()
    assert client.recreate_task_locally(g.key) == marker  # a key does too
    with pytest.raises(ValueError, match="does not know 'no-such-key'"):
        client.recreate_task_locally("no-such-key")
    with pytest.raises(TypeError, match="takes a future or a key"):
        client.recreate_task_locally(3)


def test_a_delayed_chain_s_failing_key_is_recreated_with_released_inputs_recomputed(
    cluster: InMemoryCluster, client: Client
) -> None:
    from dask import delayed

    a = delayed(inc, pure=True)(1)
    b = delayed(div, pure=True)(a, 0)
    c = delayed(inc, pure=True)(b)
    future = client.compute(c)
    wait(future)
    assert cluster.scheduler.state.tasks[str(a.key)].state == "released"
    with pytest.raises(ZeroDivisionError):
        client.recreate_error_locally(future)
    persisted = client.persist(b)
    wait(persisted)
    with pytest.raises(ZeroDivisionError):
        client.recreate_error_locally(persisted)  # a collection holding the failure


# --- dump_cluster_state -------------------------------------------------------------------


def test_dump_cluster_state_in_dask_s_formats_and_names(
    cluster: InMemoryCluster, client: Client, tmp_path: Path
) -> None:
    client.submit(inc, 1).result()
    client.dump_cluster_state(tmp_path / "d")
    with gzip.open(tmp_path / "d.msgpack.gz") as f:
        state = msgpack.unpack(f)
    assert {"scheduler", "workers", "versions"} <= set(state)
    assert set(state["workers"]) == set(client.scheduler_info()["workers"])
    client.dump_cluster_state(str(tmp_path / "d"), format="yaml", exclude=("log",))
    text = yaml.safe_load((tmp_path / "d.yaml").read_text())
    assert "log" not in text and "task_states" in text
    returned = client.dump_cluster_state(tmp_path / "d.json", format="json")
    assert "log" in returned and (tmp_path / "d.json").exists()
    with pytest.raises(ValueError, match="Unsupported format 'xml'"):
        client.dump_cluster_state(tmp_path / "d", format="xml")
    with pytest.raises(ValueError, match="writes no files"):
        client.dump_cluster_state(tmp_path / "d", write_from_scheduler=True)


# --- the same, asynchronous ------------------------------------------------------------------


def test_the_same_from_an_asynchronous_client(cluster: InMemoryCluster, tmp_path: Path) -> None:
    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            assert client.scheduler.address == cluster.address
            assert client.loop is not None and client.loop is not asyncio.get_running_loop()
            incs = client.map(inc, [1, 2])
            await wait(incs)
            assert await client.nbytes() == {"inc": 56}
            assert set(client.futures) == {f.key for f in incs}
            bad = client.submit(div, 1, client.submit(dec, 1))
            with pytest.raises(ZeroDivisionError):
                await client.recreate_error_locally(bad)
            marker = "async-here"
            assert await client.recreate_task_locally(client.submit(noting_thread, marker)) == (
                marker
            )
            assert RAN_ON[marker] == threading.get_ident()  # the awaiting loop's thread
            state = await client.dump_cluster_state(tmp_path / "a", format="json")
            assert state["workers"] and (tmp_path / "a.json").exists()

    run(main())
    before = Client(asynchronous=True, address=cluster.address)
    assert before.loop is None  # not awaited yet: no connection, no loop
