"""Dask collections on apportion: compute, persist, Dask's own compute, annotations."""

from __future__ import annotations

import collections
import operator
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest
from dask import delayed

import apportion.client.large_arguments as large_arguments
import apportion.client.session as session_module
from apportion import Client, Future, LocalCluster, futures_of, get_worker, task_resources
from apportion.testing import InMemoryCluster

pytestmark = pytest.mark.timeout(30)

#: Calls by argument, across the in-process workers' threads.
CALLS: collections.Counter[Any] = collections.Counter()
_calls_lock = threading.Lock()


def counted_double(x: int) -> int:
    with _calls_lock:
        CALLS[x] += 1
    return 2 * x


def fails_first(tag: str) -> str:
    """Raises on its first call for ``tag``, succeeds after."""
    with _calls_lock:
        CALLS[tag] += 1
        attempt = CALLS[tag]
    if attempt == 1:
        raise RuntimeError(f"{tag}: first attempt")
    return f"{tag} on attempt {attempt}"


def resources_held(_: Any = None) -> dict[str, Any]:
    return task_resources()


def wait_until_empty(client: Client, timeout: float = 5.0) -> None:
    """Releases travel asynchronously: wait until the scheduler holds no task."""
    deadline = time.monotonic() + timeout
    while (tasks := client.scheduler_info()["tasks"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tasks == {}


def negate_on_gpu(block: Any) -> Any:
    assert task_resources() == {"GPU": 1.0}, task_resources()
    return -block


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    workers = [{"name": "gpu", "nthreads": 2, "resources": "GPU=1"}, {"name": "cpu", "nthreads": 2}]
    with InMemoryCluster(workers) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    CALLS.clear()
    with Client(cluster.address) as c:
        yield c


def test_compute_gives_a_future_per_collection_and_passes_the_rest_through(
    client: Client,
) -> None:
    x = delayed(operator.add)(1, 2)
    y = delayed(operator.add)(x, x)
    xx, yy, plain = client.compute([x, y, "not a collection"])
    assert (xx.result(), yy.result(), plain) == (3, 6, "not a collection")
    assert client.compute(y).result() == 6
    assert client.compute((x, y), sync=True) == [3, 6]
    # A future inside a delayed call is a dependency, as in Dask.
    two = client.submit(operator.add, 1, 1)
    assert client.compute(delayed(operator.mul)(two, y)).result() == 12


def test_bags_and_arrays_compute_to_dasks_own_answers(client: Client) -> None:
    bag = db.from_sequence(range(10), npartitions=3).map(counted_double)
    assert client.compute(bag, sync=True) == [2 * i for i in range(10)]
    assert client.compute(bag.sum()).result() == 90
    x = da.arange(400, chunks=50).reshape((20, 20)).rechunk((5, 5))
    expected = (np.arange(400).reshape((20, 20)) + np.arange(400).reshape((20, 20)).T).mean(0)
    np.testing.assert_array_equal(client.compute((x + x.T).mean(axis=0), sync=True), expected)


def test_a_persisted_collection_is_not_computed_again(client: Client) -> None:
    bag = db.from_sequence(range(12), npartitions=4).map(counted_double)
    persisted = client.persist(bag)
    keys = list(dict(persisted.__dask_graph__()))
    assert len(keys) == 4
    assert client.compute(persisted.sum()).result() == 132
    assert client.compute(persisted.map(operator.neg).sum()).result() == -132
    assert {i: 1 for i in range(12)} == CALLS  # each element doubled once, on persist


def test_dask_compute_runs_on_the_open_client_and_not_after(cluster: InMemoryCluster) -> None:
    before = dask.config.get("scheduler", None)
    with Client(cluster.address) as client:
        bag = db.from_sequence(range(6), npartitions=2).map(resources_held)
        with dask.annotate(resources={"GPU": 1}):
            on_gpu = db.from_sequence(range(2), npartitions=2).map(resources_held)
        # Only a task on an apportion worker sees task_resources() at all.
        assert bag.compute() == [{}] * 6
        # Dask's own compute keeps annotations with its optimisation on or off.
        assert dask.compute(on_gpu)[0] == [{"GPU": 1.0}] * 2
        assert on_gpu.compute(optimize_graph=False) == [{"GPU": 1.0}] * 2
        assert client.compute(on_gpu, sync=True) == [{"GPU": 1.0}] * 2
        assert dask.compute(bag.count(), scheduler=client.get) == (6,)
        wait_until_empty(client)  # nothing left behind once Dask dropped its futures
    assert dask.config.get("scheduler", None) == before


def test_dasks_own_compute_keeps_annotations_where_its_optimisers_fuse(client: Client) -> None:
    with dask.annotate(resources={"GPU": 1}):
        held = delayed(resources_held)(delayed(operator.add)(1, 2))
        on_gpu = db.from_sequence(range(4), npartitions=2).map(resources_held)
    chain = delayed(dict)(held)  # unannotated, after the annotated call: fused with it
    # Linear fusion of delayed calls is Dask's option; a bag's optimiser always fuses.
    with dask.config.set({"optimization.fuse.delayed": True}):
        assert chain.compute() == {"GPU": 1.0}
    assert on_gpu.map(dict).compute() == [{"GPU": 1.0}] * 4
    assert dask.compute(chain, on_gpu.count()) == ({"GPU": 1.0}, 4)
    plain = db.from_sequence(range(4), npartitions=2).map(resources_held)
    assert plain.compute() == [{}] * 4


def test_annotations_set_resources_and_retries_per_task(client: Client) -> None:
    with dask.annotate(resources={"GPU": 1}):
        held = delayed(resources_held)()
    with dask.annotate(retries=1):
        flaky = delayed(fails_first)("annotated")
    plain = delayed(fails_first)("plain")
    assert client.compute(held).result() == {"GPU": 1.0}
    assert client.compute(flaky).result() == "annotated on attempt 2"
    with pytest.raises(RuntimeError, match="plain: first attempt"):
        client.compute(plain).result()
    # The compute-wide setting, for tasks no annotation covers.
    assert client.compute(delayed(fails_first)("wide"), retries=1).result() == "wide on attempt 2"


def test_resources_by_key_reach_those_tasks_and_only_those(client: Client) -> None:
    bag = db.from_sequence(range(4), npartitions=4).map(resources_held)
    grid = da.ones((4, 4), chunks=2).map_blocks(negate_on_gpu, dtype=float)
    parts = [delayed(resources_held)(i) for i in range(3)]
    by_key = {tuple(bag.__dask_keys__()): {"GPU": 1}, parts[0].key: "GPU=1"}
    assert client.compute(bag, resources=by_key, sync=True) == [{"GPU": 1.0}] * 4
    held = client.compute(parts, resources=by_key, sync=True)
    assert held == [{"GPU": 1.0}, {}, {}]
    on_gpu = {tuple(key for row in grid.__dask_keys__() for key in row): {"GPU": 1}}
    np.testing.assert_array_equal(
        client.compute(grid, resources=on_gpu, sync=True), -np.ones((4, 4))
    )


def test_a_task_that_raises_fails_its_future_with_the_original_error(client: Client) -> None:
    boom = delayed(operator.truediv)(1, 0)
    with pytest.raises(ZeroDivisionError):
        client.compute(boom + 1).result()
    assert client.compute(delayed(operator.add)(2, 2)).result() == 4  # still serving


def test_bad_annotations_and_arguments_are_refused_before_anything_runs(client: Client) -> None:
    with dask.annotate(resources={"GPU": -1}):
        bad = delayed(resources_held)()
    with pytest.raises(ValueError, match="resources annotated on"):
        client.compute(bad)
    with dask.annotate(retries=1.5):
        worse = delayed(resources_held)()
    with pytest.raises(TypeError, match=r"retries annotated on .* must be an int"):
        client.compute(worse)
    with pytest.raises(TypeError, match="persist takes Dask collections"):
        client.persist([1, 2])
    wait_until_empty(client)


@pytest.mark.process
def test_persisted_parts_lost_with_a_killed_worker_are_computed_again() -> None:
    shape = [{"name": "a", "nthreads": 1}, {"name": "b", "nthreads": 1}]
    with LocalCluster(workers=shape) as cluster, Client(cluster) as client:
        bag = db.from_sequence(range(40), npartitions=8).map(operator.mul, 3)
        persisted = client.persist(bag)
        parts = list(dict(persisted.__dask_graph__()).values())  # its futures, as in Dask
        client.gather(parts)
        on_a = [
            p
            for p in parts
            if cluster.scheduler.state.workers[cluster.scheduler.state.tasks[p.key].worker].name
            == "a"
        ]
        assert 0 < len(on_a) < len(parts), "each worker should hold some parts"
        cluster._procs[0].send_signal(signal.SIGKILL)
        assert client.compute(persisted.sum()).result() == 3 * sum(range(40))
        for part in on_a:
            story = client.story(part)
            assert any("on worker a, which left" in row[4] for row in story), "\n".join(
                map(str, story)
            )
            assert sum(row[3] == "memory" for row in story) == 2, story  # computed again


def slow_identity(x: Any) -> Any:
    time.sleep(0.5)
    return x


def nested_compute(i: int) -> int:
    return int(da.arange(10, chunks=5).sum().compute()) + i


def test_mixed_collections_come_back_in_the_order_given(client: Client) -> None:
    # Lowered together, Dask would group these by kind and reorder their keys.
    d, x, d2 = delayed(operator.add)(1, 2), da.arange(3, chunks=3), delayed(operator.add)(5, 5)
    three, array_value, ten = client.compute([d, x, d2], sync=True)
    assert (three, ten) == (3, 10)
    np.testing.assert_array_equal(array_value, np.arange(3))
    px, pb, py = client.persist([da.arange(3, chunks=3), db.from_sequence(["bag"]), da.ones(2)])
    assert client.compute(pb, sync=True) == ["bag"]
    np.testing.assert_array_equal(client.compute(px + py.sum(), sync=True), np.arange(2, 5))


def test_a_collection_computed_again_after_a_cancel_runs_again(client: Client) -> None:
    d = delayed(slow_identity)(1, pure=True)
    first = client.compute(d)
    first.cancel()
    assert client.compute(d).result(timeout=10) == 1


def test_a_collection_persisted_by_another_client_is_shared(cluster: InMemoryCluster) -> None:
    with Client(cluster.address) as a, Client(cluster.address) as b:
        # a's graph leaves late: b must not overtake it on its own connection.
        a._session.loop.loop.call_soon_threadsafe(time.sleep, 0.3)
        p = a.persist(da.arange(10, chunks=5) + 1)
        again = b.persist(p)  # nothing new to compute: b now wants a's parts as well
        np.testing.assert_array_equal(b.compute(again, sync=True), np.arange(1, 11))
        del p
        a.close()  # b's claim keeps the parts
        np.testing.assert_array_equal(b.compute(again.sum(), sync=True), 55)


def test_dask_uses_the_newest_open_client_and_its_config_still_pickles(
    cluster: InMemoryCluster,
) -> None:
    before = dask.config.get("scheduler", None)
    first, second = Client(cluster.address), Client(cluster.address)
    try:
        pickle.dumps(dask.config.config)  # Dask's process-based clusters copy it
        first.close()  # the older one first: Dask keeps using the newer one
        assert dask.compute(delayed(operator.add)(1, 1)) == (2,)
        assert dask.compute(delayed(operator.add)(2, 2), scheduler=second) == (4,)
        persisted = (da.arange(4, chunks=2) + 1).persist()  # Dask's persist, on apportion
        # As Dask's: the graph's values are the futures themselves.
        graph = dict(persisted.__dask_graph__())
        assert all(isinstance(value, Future) for value in graph.values())
        assert set(futures_of(persisted)) == set(graph.values())
        np.testing.assert_array_equal(persisted.compute(), np.arange(1, 5))
    finally:
        second.close()
        first.close()
    assert dask.config.get("scheduler", None) == before


def test_compute_inside_a_task_runs_there_instead_of_waiting_for_a_thread(
    client: Client,
) -> None:
    # Four in-process worker threads, eight tasks that each compute a collection.
    results = client.compute([delayed(nested_compute)(i) for i in range(8)], sync=True)
    assert results == [45 + i for i in range(8)]


def test_a_graph_embedding_large_values_warns_once_and_computes(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(large_arguments, "LARGE_ARGUMENT", 50_000)
    embedded = da.from_array(np.ones(80_000, np.uint8), chunks=20_000)
    with pytest.warns(
        UserWarning, match=r"graph's \d+ tasks pickle to .* consider scattering"
    ) as caught:
        total = client.compute(embedded.sum()).result(timeout=10)
    assert total == 80_000 and len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.compute(delayed(operator.add)(1, 2)).result() == 3


def test_resources_by_key_that_match_nothing_are_reported(client: Client) -> None:
    parts = [delayed(resources_held)(i) for i in range(2)]
    by_key = {parts[0].key: {"GPU": 1}}
    with pytest.warns(UserWarning, match="name none of this graph's"):
        assert client.compute(parts[1], resources=by_key, sync=True) == {}


def worker_name(_: Any = None) -> str:
    return str(get_worker().name)


def test_worker_annotations_pin_tasks_per_task(client: Client) -> None:
    with dask.annotate(workers=["cpu"]):
        on_cpu = [delayed(worker_name)(i) for i in range(4)]
    with dask.annotate(workers="gpu"):
        on_gpu = delayed(worker_name)("g")
    assert client.compute([*on_cpu, on_gpu], sync=True) == ["cpu"] * 4 + ["gpu"]


def test_equal_keys_spelt_otherwise_name_the_same_task(client: Client) -> None:
    graph = {("x", 0): 1, "y": (operator.add, ("x", np.int64(0)), 1)}
    assert client.get(graph, ["y", ("x", np.int64(0))]) == [2, 1]


def test_task_nodes_reach_inputs_spelt_otherwise_under_the_keys_own_name(
    client: Client,
) -> None:
    from dask._task_spec import DataNode, Task, TaskRef

    graph = {
        ("x", 0): DataNode(("x", 0), 1),
        "y": Task("y", operator.add, TaskRef(("x", np.int64(0))), 1),
    }
    assert client.get(graph, "y") == 2


PICKLING = threading.Event()


class SlowToPickle:
    """Pickles slowly, as a large embedded array does; says when it starts."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        PICKLING.set()
        time.sleep(0.5)
        return int, (1,)


def test_a_client_closed_while_a_graph_is_prepared_fails_its_futures(
    cluster: InMemoryCluster,
) -> None:
    client = Client(cluster.address, set_as_default=False)
    outcome: list[BaseException] = []

    def compute() -> None:
        try:
            client.compute(delayed(operator.add)(SlowToPickle(), 1)).result(timeout=10)
        except BaseException as exc:
            outcome.append(exc)

    PICKLING.clear()
    thread = threading.Thread(target=compute)
    thread.start()
    assert PICKLING.wait(10)
    client.close()
    thread.join(10)
    assert [type(e).__name__ for e in outcome] == ["LostDataError"], outcome


def test_graphs_sent_together_beyond_one_batch_leave_in_several(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch size scaled down: each graph fits one, three at once do not.
    monkeypatch.setattr(session_module, "MAX_BATCH", 200_000)
    arrays = [da.from_array(np.full(160_000, i, np.uint8), chunks=80_000) for i in range(3)]
    client._session.loop.loop.call_soon_threadsafe(time.sleep, 0.5)  # they pile up meanwhile
    futures = [client.compute(a.sum()) for a in arrays]
    assert [f.result(timeout=10) for f in futures] == [160_000 * i for i in range(3)]


def test_options_for_dasks_local_schedulers_are_ignored(client: Client) -> None:
    bag = db.from_sequence(range(4), npartitions=2)
    assert bag.sum().compute(num_workers=2) == 6
    (persisted,) = dask.persist(bag, num_workers=2)
    assert client.compute(persisted.sum(), sync=True) == 6


def test_demands_by_key_written_as_text_are_told_from_one_demand(client: Client) -> None:
    parts = [delayed(resources_held)(i) for i in range(2)]
    by_key = {parts[0].key: "GPU=1"}
    assert client.compute(parts[0], resources=by_key, sync=True) == {"GPU": 1.0}
    with pytest.warns(UserWarning, match="name none of this graph's"):
        assert client.compute(parts[1], resources=by_key, sync=True) == {}


@pytest.mark.process
def test_dasks_own_compute_and_persist_keep_annotated_blocks_on_the_gpu_worker() -> None:
    # Dask's low-level fusion would rename the annotated blocks into fused tasks with
    # no annotation, free to run on either worker.
    def block_of_pids(block: Any) -> Any:  # local: travels by value to the processes
        return np.full_like(block, os.getpid())

    shape = [{"name": "gpu", "nthreads": 2, "resources": "GPU=1"}, {"name": "cpu", "nthreads": 2}]
    with LocalCluster(workers=shape) as cluster, Client(cluster):
        gpu_pid = dask.delayed(os.getpid)().compute(resources={"GPU": 1})
        pids = {p.pid for p in cluster._procs}
        assert gpu_pid in pids and len(pids) == 2
        x = da.from_array(np.arange(256).reshape(16, 16), chunks=4)  # 16 blocks
        with dask.annotate(resources={"GPU": 1}):
            y = x.map_blocks(block_of_pids, dtype=int)
        z = (y * 1).T  # unannotated NumPy work after the annotated blocks
        assert set(np.unique(z.compute())) == {gpu_pid}
        (computed,) = dask.compute(z)
        assert set(np.unique(computed)) == {gpu_pid}
        persisted = z.persist()
        assert set(np.unique(persisted.compute())) == {gpu_pid}
        # The unannotated blocks still run anywhere: Dask's optimisation stays on for them.
        spread = x.map_blocks(block_of_pids, dtype=int).compute()
        assert set(np.unique(spread)) <= pids


CLIENT_BEFORE_DASK = """
import sys
from apportion import Client, LocalCluster, task_resources
assert "dask" not in sys.modules, "apportion imported Dask"
with LocalCluster(1, 1, processes=False) as cluster, Client(cluster):
    # Dask's variable is read without loading Dask.
    assert cluster.specs[0]["resources"] == {"GPU": 10000}, cluster.specs
    assert "dask" not in sys.modules, "the cluster or client imported Dask"
    import dask  # after the client: it still becomes Dask's scheduler
    import dask.bag as db
    # task_resources() raises anywhere but in a task on an apportion worker.
    with dask.annotate(resources={"GPU": 1}):
        assert dask.delayed(task_resources)().compute() == {"GPU": 1.0}
    assert db.from_sequence(range(4), npartitions=2).map(lambda i: i * 2).sum().compute() == 12
    assert dask.__spec__.loader is dask.__loader__ and type(dask.__loader__).__module__ != __name__
    assert not any("dask_default" in type(f).__module__ for f in sys.meta_path)
assert dask.config.get("scheduler", None) is None  # closed: Dask's own schedulers again
print("ran on apportion")
"""


@pytest.mark.process
def test_a_client_made_before_dask_is_imported_becomes_dasks_scheduler() -> None:
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__RESOURCES__GPU": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CLIENT_BEFORE_DASK],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran on apportion"
