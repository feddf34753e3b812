"""Failure paths of the client: nothing may hang, every failure says what happened."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from apportion import Client, LostDataError, as_completed
from apportion.client.errors import SerializationError
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import InMemoryCluster


@pytest.fixture
def cluster() -> Iterator[InMemoryCluster]:
    workers = [
        {"name": "a", "nthreads": 2, "resources": "x=1"},
        {"name": "b", "nthreads": 2, "resources": "GPU=1"},
    ]
    with InMemoryCluster(workers) as c:
        yield c
        check_invariants(c.scheduler.state)


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with Client(cluster.address) as c:
        yield c


def sleepy(x: Any, delay: float) -> Any:
    time.sleep(delay)
    return x


def make_lock() -> Any:
    return threading.Lock()


def test_a_raising_callback_is_logged_and_the_client_keeps_working(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    fired = threading.Event()
    results: list[int] = []

    def reads_result(fut: Any) -> None:
        results.append(fut.result())  # would deadlock on the client's event loop
        fired.set()

    def explodes(fut: Any) -> None:
        raise RuntimeError("callback bug")

    first = client.submit(sleepy, 1, 0.1, pure=False)
    first.add_done_callback(explodes)
    first.add_done_callback(reads_result)
    assert fired.wait(10)
    assert results == [1]
    assert client.submit(operator.add, 1, 1).result(timeout=10) == 2
    assert any("callback bug" in r.getMessage() or r.exc_info for r in caplog.records)


def test_close_settles_pending_futures_instead_of_hanging(cluster: InMemoryCluster) -> None:
    client = Client(cluster.address)
    fut = client.submit(sleepy, 1, 5, pure=False)
    outcome: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            fut.result(timeout=30)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    client.close()
    waiter.join(10)
    assert not waiter.is_alive()
    assert isinstance(outcome[0], LostDataError) and "closed" in str(outcome[0])
    with pytest.raises(RuntimeError, match="closed"):
        client.submit(operator.neg, 1)


def test_as_completed_timeout_keeps_the_futures(client: Client) -> None:
    futures = [client.submit(sleepy, i, 0.5 + i / 4, pure=False) for i in range(2)]
    iterator = as_completed(futures, timeout=0.05)
    seen: list[Any] = []
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        try:
            seen.append(next(iterator).result())
        except TimeoutError:
            continue
    assert sorted(seen) == [0, 1]


def test_results_lost_with_a_worker_are_recomputed_not_failed(
    cluster: InMemoryCluster, client: Client
) -> None:
    futures = client.map(sleepy, range(8), [0.01] * 8, pure=False)
    assert client.gather(futures) == list(range(8))
    state = cluster.scheduler.state
    on_a = [f for f in futures if state.workers[state.tasks[f.key].worker or ""].name == "a"]
    assert on_a, "some results live on worker a"
    victim = next(w for w in cluster.workers if w.name == "a")
    cluster.run(victim.close())
    assert client.gather(futures) == list(range(8))
    assert all(f.status == "finished" for f in futures)


def test_unpicklable_result_fails_its_dependents_clearly(client: Client) -> None:
    lock = client.submit(make_lock, resources={"x": 1})
    user = client.submit(lambda held: held.locked(), lock, resources={"GPU": 1})
    with pytest.raises(SerializationError, match="cannot be pickled"):
        user.result(timeout=10)
    with pytest.raises(SerializationError, match="cannot be pickled"):
        lock.result(timeout=10)
    assert client.submit(operator.add, 2, 3).result(timeout=10) == 5


def test_keys_must_be_strings_and_graph_keys_must_stay_distinct(client: Client) -> None:
    with pytest.raises(TypeError, match="key must be a str"):
        client.submit(operator.neg, 1, key=123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be a str"):
        client.map(operator.neg, [1], key=[("x", 1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="both travel as '1'"):
        client.get({1: 10, "1": 20, "y": (operator.add, 1, "1")}, "y")
    assert client.get({("x", 0): 1, "y": (operator.neg, ("x", 0))}, "y") == -1
    assert client.submit(operator.neg, 5).result(timeout=10) == -5


def test_large_arguments_warn_and_still_run_while_scattered_values_do_not_warn(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import apportion.client.large_arguments as large_arguments

    monkeypatch.setattr(large_arguments, "LARGE_ARGUMENT", 1000)
    with pytest.warns(UserWarning, match=r"arguments of 'len' pickle to .* client.scatter"):
        future = client.submit(len, b"x" * 5000)
    assert future.result(timeout=10) == 5000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [scattered] = client.scatter([b"y" * 5000])
        assert client.submit(len, scattered).result(timeout=10) == 5000
        assert client.submit(len, b"x" * 10).result(timeout=10) == 10


def test_cancel_leaves_finished_results_alone_and_resubmission_runs(client: Client) -> None:
    done = client.submit(operator.add, 20, 1)
    assert done.result(timeout=10) == 21
    done.cancel()
    assert done.status == "finished" and done.result(timeout=10) == 21
    slow = client.submit(sleepy, "again", 0.3)
    slow.cancel()
    assert slow.cancelled()
    again = client.submit(sleepy, "again", 0.3)
    assert again.key == slow.key
    assert again.result(timeout=10) == "again"


def test_gather_skip_leaves_failures_out(client: Client) -> None:
    good = client.submit(operator.add, 1, 1)
    bad = client.submit(operator.truediv, 1, 0)
    assert client.gather([good, bad], errors="skip") == [2]
    assert client.gather({"g": good, "b": bad}, errors="skip") == {"g": 2}
    with pytest.raises(ValueError, match="errors must be"):
        client.gather([good], errors="ignore")
    with pytest.raises(ZeroDivisionError):
        client.gather([good, bad])


#: Set at the end of the test that holds tasks on it (workers share this process).
HOLD = threading.Event()


def held() -> int:
    HOLD.wait(30)
    return 1


def test_a_failure_is_raised_at_once_not_after_the_rest(client: Client) -> None:
    """As Dask's: ``gather`` and ``get`` raise the first failure while the other
    tasks still run (they would run for as long as ``HOLD`` stays unset here)."""
    HOLD.clear()
    try:
        slow = client.submit(held, pure=False)
        bad = client.submit(operator.truediv, 1, 0)
        with pytest.raises(ZeroDivisionError):
            client.gather([slow, bad])
        assert not slow.done()
        with pytest.raises(ZeroDivisionError):
            client.get({"s": (held,), "b": (operator.truediv, 2, 0)}, ["s", "b"])

        async def gathered() -> None:
            async with Client(client.scheduler_address, asynchronous=True) as ac:
                late = ac.submit(held, pure=False)
                with pytest.raises(ZeroDivisionError):
                    await ac.gather([late, ac.submit(operator.truediv, 3, 0)])
                assert not late.done()

        asyncio.run(gathered())
    finally:
        HOLD.set()
    assert slow.result(timeout=10) == 1


def _no_work_within(processing: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(processing().values()):
        assert time.monotonic() < deadline, processing()
        time.sleep(0.01)


def test_a_failed_get_leaves_nothing_in_processing_while_its_work_still_runs(
    client: Client,
) -> None:
    """As Dask's: the get's futures are released on its error, so ``processing()``
    is empty at once, though the released task's thread runs until ``HOLD`` is set."""
    HOLD.clear()
    try:
        with pytest.raises(ZeroDivisionError):
            client.get({"y": (held,), "x": (operator.truediv, 1, 0)}, ["x", "y"])
        _no_work_within(client.processing, 0.5)

        async def failed_get() -> None:
            async with Client(client.scheduler_address, asynchronous=True) as ac:
                with pytest.raises(ZeroDivisionError):
                    await ac.get({"v": (held,), "w": (operator.truediv, 2, 0)}, ["w", "v"])
                deadline = time.monotonic() + 0.5
                while any((await ac.processing()).values()):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)

        asyncio.run(failed_get())
    finally:
        HOLD.set()
    # The threads held meanwhile come back: new work runs on every one of them.
    assert client.gather(client.map(operator.neg, range(8))) == [-i for i in range(8)]


def test_every_client_is_told_when_nobody_can_run_its_request() -> None:
    # A cluster that may grow: the requests wait, and each client is told why.
    with InMemoryCluster([{"resources": "GPU=2"}], config=SchedulerConfig()) as cluster:
        one, two = cluster.client(), cluster.client()
        futures = [c.submit(operator.neg, 1, resources={"GPU": 5}) for c in (one, two)]
        deadline = time.monotonic() + 10
        while not (one.notices and two.notices) and time.monotonic() < deadline:
            time.sleep(0.01)  # notices arrive by message; the client has no event for them
        assert one.notices and two.notices
        assert "largest GPU supply is 2" in two.notices[0]
        for fut in futures:
            fut.cancel()


def test_the_callback_thread_does_not_keep_futures_alive(
    cluster: InMemoryCluster, client: Client
) -> None:
    import gc

    futures = client.map(operator.neg, range(5))
    iterator = as_completed(futures)
    next(iterator)  # stop early, then drop everything
    del futures, iterator
    gc.collect()
    deadline = time.monotonic() + 10
    while cluster.scheduler.state.tasks and time.monotonic() < deadline:
        time.sleep(0.01)  # polling until the releases reach the scheduler
    assert not cluster.scheduler.state.tasks
