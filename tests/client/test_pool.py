"""``apportion.Pool``: ``multiprocessing.Pool``'s methods and semantics, on a cluster in
this process (tasks run in this process, so they can share the test's counters)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from typing import Any

import pytest

from apportion import Client, Pool, get_worker, task_resources
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client

#: Tasks waiting on this end when the test sets it (always set by the fixture's end).
GATE = threading.Event()


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    workers = [{"name": "gpu", "nthreads": 2, "resources": "GPU=1"}, {"name": "cpu", "nthreads": 2}]
    with InMemoryCluster(workers) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    GATE.clear()
    with checked_client(cluster) as c:
        try:
            yield c
        finally:
            GATE.set()


def square(x: int) -> int:
    return x * x


def add(a: int, b: int, c: int = 0) -> int:
    return a + b + c


def gated(x: int) -> int:
    GATE.wait(20)
    return x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ZeroDivisionError(f"three is {x}")
    return x


def test_map_starmap_and_apply_give_results_in_order(client: Client) -> None:
    with Pool(client=client) as pool:
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
        assert pool.map(square, range(20), chunksize=6) == [x * x for x in range(20)]
        assert pool.map(square, []) == []
        assert pool.starmap(add, [(1, 2), (3, 4)]) == [3, 7]
        assert pool.apply(add, (1, 2), {"c": 10}) == 13


def test_apply_async_is_an_async_result(client: Client) -> None:
    got: list[Any] = []
    with Pool(client=client) as pool:
        waiting = pool.apply_async(gated, (5,), callback=got.append)
        assert not waiting.ready()
        with pytest.raises(ValueError, match="not ready"):
            waiting.successful()
        with pytest.raises(multiprocessing.TimeoutError):
            waiting.get(timeout=0.1)
        GATE.set()
        waiting.wait(10)
        assert waiting.ready() and waiting.successful() and waiting.get() == 5
        mapped = pool.map_async(square, range(5))
        assert mapped.get(10) == [0, 1, 4, 9, 16]
        assert pool.starmap_async(add, [(1, 1)]).get(10) == [2]
    assert got == [5]  # the callback ran once the call ended


def test_a_failure_is_raised_by_get_and_given_to_error_callback(client: Client) -> None:
    errors: list[BaseException] = []
    with Pool(client=client) as pool:
        with pytest.raises(ZeroDivisionError, match="three is 3"):
            pool.map(fail_on_three, range(6))
        result = pool.apply_async(fail_on_three, (3,), error_callback=errors.append)
        result.wait(10)
        assert result.ready() and not result.successful()
        with pytest.raises(ZeroDivisionError):
            result.get()
        with pytest.raises(ZeroDivisionError):
            list(pool.imap(fail_on_three, range(6)))
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)


def test_imap_keeps_order_and_imap_unordered_yields_as_calls_end(client: Client) -> None:
    with Pool(client=client) as pool:
        assert list(pool.imap(square, range(10), chunksize=3)) == [x * x for x in range(10)]
        unordered = pool.imap_unordered(gated, [1, 2])
        quick = pool.imap_unordered(square, range(4))
        assert sorted(quick) == [0, 1, 4, 9]
        GATE.set()
        assert sorted(unordered) == [1, 2]
        GATE.clear()
        seen = []
        slow_first = pool.imap_unordered(gated_unless_quick, [100, 1, 2, 3])
        for value in slow_first:
            seen.append(value)
            if len(seen) == 3:
                GATE.set()  # the slow call may end only once the three quick ones came
        assert set(seen[:3]) == {1, 2, 3}
        assert seen[3] == 100


def gated_unless_quick(x: int) -> int:
    if x == 100:
        GATE.wait(20)
    return x


_running = 0
_most = 0
_count_lock = threading.Lock()


def counted(x: int) -> int:
    """Count the calls running at once; wait (a little) for a third to start."""
    global _running, _most
    with _count_lock:
        _running += 1
        _most = max(_most, _running)
    deadline = time.monotonic() + 0.3
    while _most < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    with _count_lock:
        _running -= 1
    return x


def test_processes_bounds_the_calls_running_at_once(client: Client) -> None:
    global _most
    _most = 0
    with Pool(2, client=client) as pool:  # the cluster has four threads
        assert pool.map(counted, range(6)) == list(range(6))
    assert _most == 2
    _most = 0
    with Pool(client=client) as pool:
        pool.map(counted, range(12))
    assert _most > 2


def where(_: int) -> tuple[str, dict[str, Any]]:
    return get_worker().name, task_resources()


def test_resources_apply_to_every_call(client: Client) -> None:
    with Pool(client=client, resources={"GPU": 1}) as pool:
        assert pool.map(where, range(6)) == [("gpu", {"GPU": 1.0})] * 6


_initialized: list[str] = []


def remember(tag: str) -> None:
    _initialized.append(tag)


def test_the_initializer_runs_once_per_worker_process(client: Client) -> None:
    _initialized.clear()
    with Pool(client=client, initializer=remember, initargs=("x",)) as pool:
        pool.map(square, range(10))
    assert _initialized == ["x"]  # both workers of this cluster are this one process


def test_a_closed_pool_refuses_work_and_join_needs_close(client: Client) -> None:
    pool = Pool(client=client)
    with pytest.raises(ValueError, match="Pool is still running"):
        pool.join()
    result = pool.map_async(square, range(4))
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, [1])
    with pytest.raises(ValueError, match="Pool not running"):
        pool.apply_async(square, (1,))
    pool.join()
    assert result.ready() and result.get() == [0, 1, 4, 9]


def test_leaving_the_with_block_terminates_the_pool(client: Client) -> None:
    with Pool(1, client=client) as pool:
        running = pool.apply_async(gated, (1,))
        queued = pool.apply_async(gated, (2,))
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, [1])
    pool.join()  # terminated: nothing left to wait for
    running.wait(10)
    assert running.ready()
    with pytest.raises(Exception, match="cancelled"):
        running.get(0)
    # Never started: ready at once, and get() says so (the standard pool's would wait
    # for ever).
    assert queued.ready() and not queued.successful()
    with pytest.raises(CancelledError, match="terminated before this call started"):
        queued.get(0)


def test_iterating_a_terminated_pools_calls_raises_instead_of_waiting(client: Client) -> None:
    pool = Pool(1, client=client)
    ordered = pool.imap(gated, [1, 2, 3])
    unordered = pool.imap_unordered(gated, [4, 5, 6])
    pool.terminate()
    with pytest.raises(CancelledError):
        list(ordered)
    with pytest.raises(CancelledError):
        list(unordered)


def test_bad_arguments_are_refused_in_one_line(client: Client) -> None:
    with pytest.raises(ValueError, match="maxtasksperchild and context must be None"):
        Pool(client=client, maxtasksperchild=5)
    with pytest.raises(ValueError, match="at least 1"):
        Pool(0, client=client)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['resource'\]"):
        Pool(client=client, resource={"GPU": 1})
    with Pool(client=client) as pool, pytest.raises(ValueError, match="Chunksize must be 1"):
        pool.map(square, [1], chunksize=0)
