"""as_completed, progress and get_executor, used as Dask's documentation uses them."""

from __future__ import annotations

import concurrent.futures as cf
import io
import operator
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apportion import Client, LostDataError, as_completed, progress, wait
from apportion.client.progress import futures_of, render, render_one
from apportion.core.groups import group_of
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client, settle


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"nthreads": 2}] * 2) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


def inc(x: int) -> int:
    return x + 1


def slow_inc(x: int, delay: float = 0.05) -> int:
    time.sleep(delay)
    return x + 1


def fail_on(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"bad input {x}")
    return x


def wait_for(event_path: str) -> int:
    """Block until a file exists: a task that finishes when the test says so."""
    import os

    while not os.path.exists(event_path):
        time.sleep(0.01)
    return 1


# --- as_completed ---------------------------------------------------------------------


def test_as_completed_yields_each_future_once_and_can_grow(client: Client) -> None:
    futures = client.map(inc, range(5))
    seq = as_completed(futures)
    seen = []
    for future in seq:
        value = future.result()
        seen.append(value)
        if value < 3:  # Dask's documented pattern: add work while iterating
            seq.add(client.submit(operator.mul, value, 100))
    assert sorted(seen) == sorted([1, 2, 3, 4, 5, 100, 200])
    assert seq.is_empty() and seq.count() == 0


def test_as_completed_update_batches_and_count(client: Client) -> None:
    seq = as_completed()
    assert seq.is_empty()
    seq.update(client.map(inc, range(10)))
    assert seq.count() == 10
    batches = list(seq.batches())
    assert sum(len(b) for b in batches) == 10
    assert sorted(f.result() for batch in batches for f in batch) == list(range(1, 11))
    with pytest.raises(TypeError, match="takes futures"):
        seq.update([1, 2])


def test_as_completed_with_results_raises_or_returns_errors(client: Client) -> None:
    futures = client.map(fail_on, range(4), bad=2)
    pairs = list(as_completed(futures, with_results=True, raise_errors=False))
    by_value = {f.key: r for f, r in pairs}
    failed = [r for f, r in pairs if f.status == "error"]
    assert len(pairs) == 4 and len(failed) == 1
    typ, exc, _tb = failed[0]
    assert typ is ValueError and "bad input 2" in str(exc)
    assert sorted(v for v in by_value.values() if isinstance(v, int)) == [0, 1, 3]
    with pytest.raises(ValueError, match="bad input 2"):
        for _ in as_completed(client.map(fail_on, range(4), bad=2), with_results=True):
            pass


def test_as_completed_with_results_raises_a_failed_fetch_where_it_is_iterated(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result is fetched ahead (here, or on the callback thread) and unpickled by
    the iterating thread; a fetch that failed is raised there, not lost in a thread."""
    futures = client.map(inc, range(3))
    wait(futures)

    def lost(keys: list[str]) -> Any:
        raise LostDataError(f"results no longer held by any worker: {keys}")

    monkeypatch.setattr(client, "_gather_pickled", lost)
    pairs = as_completed(futures, with_results=True)  # all done: fetched at once
    with pytest.raises(LostDataError, match="no longer held"):
        next(pairs)
    assert pairs.count() == 2  # the others still to come


def test_as_completed_timeout_counts_from_creation(client: Client, tmp_path: Any) -> None:
    flag = tmp_path / "go"
    future = client.submit(wait_for, str(flag), pure=False)
    seq = as_completed([future], timeout=0.2)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        next(seq)
    assert time.monotonic() - start < 5
    assert seq.count() == 1  # still counted: a later next() yields it
    flag.touch()
    deadline = time.monotonic() + 10
    while not seq.has_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert next(seq) is future  # a finished future is yielded after the deadline too
    seq.clear()


def test_next_batch_without_blocking(client: Client) -> None:
    seq = as_completed(client.map(inc, range(3)))
    got: list[Any] = seq.next_batch(block=False)  # whatever is done already, maybe nothing
    while not seq.is_empty():
        got.extend(seq.next_batch())
    assert len(got) == 3


# --- progress -------------------------------------------------------------------------


def test_group_of_strips_hashes_and_indices() -> None:
    assert group_of("inc-3f2a9c1d00aa11bb22cc33dd44ee55ff") == "inc"
    assert group_of("slow_inc-1a2b3c4d5e6f7a8b-17") == "slow_inc"
    assert group_of("('sum-aggregate-9c1d2e3f4a5b6c7d', 0)") == "sum-aggregate"
    assert group_of("('random_sample-abcdef0123456789', 1, 2)") == "random_sample"
    assert group_of("x") == "x"


def test_render_shows_each_group() -> None:
    lines = render([("inc", 5, 0, 10), ("sum", 1, 1, 2)], 1.5, width=10)
    assert lines[0].startswith("[#####     ] |  50% Running | inc 5/10")
    assert "100% Completed, 1 failed | sum 2/2" in lines[1]


def test_progress_draws_one_bar_per_group_and_returns_when_done(client: Client) -> None:
    futures = [*client.map(slow_inc, range(6)), client.submit(operator.add, 1, 2)]
    out = io.StringIO()
    assert progress(futures, multi=True, notebook=False, file=out, interval=0.01) is None
    assert all(f.done() for f in futures)
    text = out.getvalue()
    assert "slow_inc 6/6" in text and re.search(r"add +1/1", text)
    assert text.count("\n") == 2  # not a terminal: the final bars once, not every tick


def test_progress_in_a_terminal_is_dasks_single_bar_with_failures(client: Client) -> None:
    futures = client.map(fail_on, range(3), bad=1)
    out = io.StringIO()
    progress(futures, notebook=False, file=out, interval="20ms")  # Dask's text too
    # As Dask's: the last drawing after a carriage return, its three fields by "|".
    bar, percent, elapsed = (part.strip() for part in out.getvalue().split("\r")[-2].split("|"))
    assert bar == "[" + "#" * 40 + "]" and percent == "100% Completed, 1 failed"
    assert elapsed.endswith("s") and out.getvalue().endswith("\r\n")
    assert render_one([("inc", 1, 0, 4)], 0.25, width=8) == "[##      ] | 25% Completed | 0.2s"
    with pytest.raises(ValueError, match="interval"):
        progress(futures, notebook=False, interval="-1s")


def test_progress_groups_by_a_function_of_the_key_and_refuses_a_bad_group_by(
    client: Client,
) -> None:
    keys = [f"odd-{i}" if i % 2 else f"even-{i}" for i in range(4)]
    futures = client.map(inc, range(4), key=keys)
    out = io.StringIO()
    progress(futures, multi=True, notebook=False, file=out, group_by=lambda key: key[-1])
    assert [line.split("|")[2].split() for line in out.getvalue().splitlines()] == [
        ["0", "1/1"],
        ["1", "1/1"],
        ["2", "1/1"],
        ["3", "1/1"],
    ]
    out = io.StringIO()
    progress(futures, multi=True, notebook=False, file=out, group_by="spans")  # by group
    assert re.search(r"even +2/2", out.getvalue()) and re.search(r"odd +2/2", out.getvalue())
    with pytest.raises(ValueError, match="group_by"):
        progress(futures, notebook=False, group_by="incorrect")


def test_progress_redraws_in_place_on_a_terminal(client: Client) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    futures = client.map(slow_inc, range(4), delay=0.1)
    progress(futures, multi=True, notebook=False, file=out, interval=0.02)
    assert "\x1b[1F" in out.getvalue()  # moved back up to redraw the bars
    out = Terminal()
    progress(client.map(slow_inc, range(4, 8), delay=0.1), notebook=False, file=out, interval=0.02)
    assert out.getvalue().count("\r[") > 1  # Dask's one bar, redrawn after each return


def test_progress_of_a_persisted_collection(client: Client) -> None:
    db = pytest.importorskip("dask.bag")
    bag = client.persist(db.from_sequence(range(8), npartitions=4).map(inc))
    assert len(futures_of(bag)) == 4
    assert futures_of([db.Bag, bag]) == futures_of(bag)  # a collection's class holds none
    out = io.StringIO()
    progress(bag, notebook=False, file=out)
    assert "100% Completed" in out.getvalue()
    assert sorted(client.compute(bag, sync=True)) == list(range(1, 9))


# --- get_executor ---------------------------------------------------------------------


def test_executor_submit_map_and_standard_waits(client: Client) -> None:
    with client.get_executor() as executor:
        futures = [executor.submit(inc, i) for i in range(5)]
        done, _ = cf.wait(futures)
        assert sorted(f.result() for f in done) == [1, 2, 3, 4, 5]
        assert sorted(f.result() for f in cf.as_completed(futures)) == [1, 2, 3, 4, 5]
        assert list(executor.map(operator.add, range(4), range(4))) == [0, 2, 4, 6]
        with pytest.raises(ValueError, match="bad input 3"):
            executor.submit(fail_on, 3, bad=3).result()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(inc, 1)


def test_executor_keywords_apply_to_every_task(client: Client) -> None:
    executor = client.get_executor(pure=False, priority=5)
    a, b = executor.submit(inc, 1), executor.submit(inc, 1)
    assert a.result() == b.result() == 2
    assert executor.submit(inc, 2, pure=False).result() == 3  # given twice: the call's wins
    with pytest.raises(TypeError, match=r"unsupported arguments to ClientExecutor.*does not take"):
        client.get_executor(nonsense=True)
    executor.shutdown()
    x, y = client.submit(inc, 1), client.submit(inc, 2)
    with pytest.raises(TypeError, match=r"one list, wait\(\[x, y\]\)"):
        wait(x, y)  # Dask's users meet this: the second argument is the timeout
    assert wait([x, y]).not_done == set()


def test_executor_map_timeout_and_cancel(client: Client, tmp_path: Any) -> None:
    executor = client.get_executor(pure=False)
    flag = tmp_path / "never"
    results = executor.map(wait_for, [str(flag)] * 2, timeout=0.2)
    with pytest.raises(cf.TimeoutError):
        next(results)
    results.close()  # abandoned: the rest are cancelled
    blocked = executor.submit(wait_for, str(flag))
    assert blocked.cancel() is True  # still pending: cancelled, and so is its task
    stop = threading.Timer(0.2, flag.touch)
    stop.start()
    executor.shutdown(wait=True)
    stop.join()


def test_progress_in_a_notebook_returns_a_widget_that_follows(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    class Widget:
        def __init__(self, children: Any = (), **kwargs: Any) -> None:
            self.children = list(children)
            self.value: Any = 0
            self.bar_style = ""
            self.__dict__.update(kwargs)

    fake = types.ModuleType("ipywidgets")
    fake.IntProgress = fake.HTML = fake.HBox = fake.VBox = Widget  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ipywidgets", fake)
    sys.modules.pop("apportion.client.progress_widget", None)
    futures = client.map(slow_inc, range(4), delay=0.1)
    shown = progress(futures, notebook=True, interval=0.01)
    assert not all(f.done() for f in futures)  # returned at once, as Dask's widget does
    bar, label = shown._bars["slow_inc"]
    assert bar.max == 4
    deadline = time.monotonic() + 10
    while bar.value < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bar.value == 4 and bar.bar_style == "success" and "4 / 4" in label.value
    sys.modules.pop("apportion.client.progress_widget", None)


def test_leaving_an_executor_block_waits_for_the_futures_it_returned(client: Client) -> None:
    with client.get_executor(pure=False) as executor:
        futures = [executor.submit(slow_inc, i, 0.1) for i in range(4)]
    assert all(f.done() for f in futures)  # set, not only finished on the cluster
    assert sorted(f.result() for f in futures) == [1, 2, 3, 4]


def test_a_cancelled_standard_future_wakes_its_waiters(client: Client, tmp_path: Any) -> None:
    executor = client.get_executor(pure=False)
    outer = executor.submit(wait_for, str(tmp_path / "never"))
    assert outer.cancel()
    done, _ = cf.wait([outer], timeout=5)  # a cancelled future must count as done
    assert done == {outer} and list(cf.as_completed([outer], timeout=5)) == [outer]
    executor.shutdown(wait=True)  # returns: nothing left to wait for
    (tmp_path / "never").touch()  # the task may have started: let its thread go


def test_progress_counts_futures_lost_with_their_client_as_failed(
    cluster: InMemoryCluster,
) -> None:
    client = Client(cluster.address)
    futures = client.map(slow_inc, range(4), delay=0.5)
    closer = threading.Timer(0.1, client.close)
    closer.start()
    out = io.StringIO()
    progress(futures, notebook=False, file=out)
    closer.join()
    assert {f.status for f in futures} == {"lost"}
    assert "4 failed" in out.getvalue() and "Completed" in out.getvalue()
    settle(cluster)
