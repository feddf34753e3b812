"""The client API against an in-memory cluster (no socket, no subprocess)."""

from __future__ import annotations

import asyncio
import gc
import operator
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apportion import (
    Client,
    FutureCancelledError,
    LocalCluster,
    Scheduler,
    UnsatisfiableError,
    Worker,
    as_completed,
    get_worker,
    task_resources,
    wait,
)
from apportion.deploy.local_shape import worker_command, worker_spec
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client, settle


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(
        workers=[
            {"name": "gpu-a", "nthreads": 2, "resources": "GPU=2"},
            {"name": "plain", "nthreads": 2},
        ],
    ) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


class Boom(Exception):
    pass


def explode(x: int) -> int:
    raise Boom(f"boom {x}")


def slow_identity(x: Any, delay: float = 0.05) -> Any:
    time.sleep(delay)
    return x


def test_submit_result_and_dependencies(client: Client) -> None:
    a = client.submit(operator.add, 1, 2)
    b = client.submit(operator.mul, a, 10)
    c = client.submit(sum, [a, b, {"not": "a future"}["not"] and 0])
    assert b.result(timeout=10) == 30
    assert c.result(timeout=10) == 33
    assert a.status == "finished" and a.done()


def test_futures_nested_in_containers_become_dependencies(client: Client) -> None:
    xs = client.map(operator.neg, range(5))
    total = client.submit(
        lambda d: sum(d["values"]) + d["extra"][0], {"values": xs, "extra": (xs[0],)}
    )
    assert total.result(timeout=10) == -10 + 0


def test_map_gather_and_keyword_arguments(client: Client) -> None:
    futures = client.map(operator.add, range(100), range(100))
    assert client.gather(futures) == [2 * i for i in range(100)]
    assert client.submit(slow_identity, x=5, delay=0).result(timeout=10) == 5


def test_map_and_submit_warn_of_large_arguments_at_the_callers_line(client: Client) -> None:
    big = b"x" * (11 * 2**20)
    with pytest.warns(UserWarning, match="consider scattering") as caught:
        futures = client.map(len, [big, b"small"], pure=False)
    assert [w.filename for w in caught] == [__file__]
    with pytest.warns(UserWarning, match="consider scattering") as caught:
        future = client.submit(len, big, pure=False)
    assert [w.filename for w in caught] == [__file__]
    assert client.gather([*futures, future]) == [len(big), 5, len(big)]


def test_map_of_nothing_is_nothing_and_keys_of_the_wrong_type_are_refused(
    client: Client,
) -> None:
    assert client.map(len, []) == []
    with pytest.raises(TypeError, match="key must be a str"):
        client.map(len, ["a", "b"], key=["k-1", 2])  # type: ignore[list-item]


def test_pure_calls_share_a_key_and_impure_do_not(client: Client) -> None:
    assert client.submit(operator.add, 1, 1).key == client.submit(operator.add, 1, 1).key
    assert client.submit(time.time, pure=False).key != client.submit(time.time, pure=False).key
    assert client.submit(operator.add, 1, 1, key="mine").key == "mine"


def test_old_style_graph(client: Client) -> None:
    dsk = {"x": 1, "y": (operator.add, "x", 2), "z": (sum, ["x", "y", (operator.mul, "y", 10)])}
    assert client.get(dsk, "y") == 3
    assert client.get(dsk, ["z", ["x"]]) == [34, [1]]
    with pytest.raises(ValueError, match="cycle"):
        client.get({"a": (operator.neg, "b"), "b": (operator.neg, "a")}, "a")


def test_task_exception_keeps_type_and_traceback(client: Client) -> None:
    fut = client.submit(explode, 7)
    with pytest.raises(Boom, match="boom 7") as info:
        fut.result(timeout=10)
    assert any(frame.name == "explode" for frame in info.traceback)
    assert isinstance(fut.exception(), Boom)
    assert fut.status == "error"
    dependent = client.submit(operator.neg, fut)
    with pytest.raises(Boom):
        dependent.result(timeout=10)
    # The cluster keeps working after errors.
    assert client.submit(operator.add, 2, 2).result(timeout=10) == 4


def test_retries_rerun_a_failing_task(client: Client, tmp_path: Any) -> None:
    marker = tmp_path / "attempts"

    def flaky() -> int:
        with open(marker, "a") as f:
            f.write("x")
        if len(marker.read_text()) < 3:
            raise RuntimeError("not yet")
        return len(marker.read_text())

    assert client.submit(flaky, retries=2, pure=False).result(timeout=10) == 3


def test_resources_and_task_resources(client: Client) -> None:
    def where() -> tuple[str, dict[str, Any]]:
        return get_worker().name, task_resources()

    name, held = client.submit(where, resources={"GPU": 1}, pure=False).result(timeout=10)
    assert name == "gpu-a" and held == {"GPU": 1.0}
    assert client.submit(where, pure=False).result(timeout=10)[1] == {}


def test_unsatisfiable_request_fails_at_once_on_a_local_cluster(client: Client) -> None:
    with pytest.raises(UnsatisfiableError, match=r"GPU=3.*largest GPU supply is 2 on gpu-a"):
        client.submit(operator.neg, 1, resources={"GPU": 3}).result(timeout=10)
    with pytest.raises(UnsatisfiableError, match="no worker offers licence"):
        client.submit(operator.neg, 1, resources="licence=1").result(timeout=10)


def test_malformed_resources_are_value_errors(client: Client) -> None:
    for spec in ["GPU", "GPU=-1", "GPU=abc", "=2"]:
        with pytest.raises(ValueError):
            client.submit(operator.neg, 1, resources=spec)


def test_wait_and_as_completed(client: Client) -> None:
    futures = [client.submit(slow_identity, i, 0.01 * (5 - i), pure=False) for i in range(5)]
    done, not_done = wait(futures, timeout=10)
    assert len(done) == 5 and not not_done
    more = client.map(slow_identity, range(10, 15), pure=False)
    seen = sorted(result for _, result in as_completed(more, with_results=True))
    assert seen == list(range(10, 15))


def test_add_done_callback_and_cancel(client: Client) -> None:
    fired = threading.Event()
    fut = client.submit(operator.neg, 3)
    fut.add_done_callback(lambda f: fired.set())
    assert fired.wait(10)
    blocker = client.submit(slow_identity, 0, 0.5, pure=False)
    later = client.submit(operator.neg, blocker)
    later.cancel()
    with pytest.raises(FutureCancelledError):
        later.result(timeout=10)
    assert later.cancelled()
    assert blocker.result(timeout=10) == 0


def test_scatter_and_gather_through_the_scheduler(client: Client) -> None:
    [x] = client.scatter([41])
    named = client.scatter({"named": 1})
    assert client.submit(operator.add, x, named["named"]).result(timeout=10) == 42
    assert client.gather({"a": x, "b": [named["named"]]}) == {"a": 41, "b": [1]}


def test_direct_to_workers_gathers_and_scatters_without_the_scheduler(
    cluster: InMemoryCluster,
) -> None:
    with Client(cluster.address, direct_to_workers=True) as direct:
        assert direct.gather(direct.map(operator.neg, range(10))) == [-i for i in range(10)]
        relayed_before = cluster.scheduler.state.relays.next_id
        xs = direct.scatter([1, 2, 3, 4])
        total = direct.submit(sum, xs)
        assert total.result(timeout=10) == 10
        assert direct.gather(xs) == [1, 2, 3, 4]
        # Nothing went through the scheduler's relay.
        assert cluster.scheduler.state.relays.next_id == relayed_before
        holders = {cluster.scheduler.state.tasks[x.key].worker for x in xs}
        assert len(holders) == 2  # spread over both workers


def test_released_futures_free_results(cluster: InMemoryCluster, client: Client) -> None:
    futures = client.map(operator.neg, range(20))
    client.gather(futures)
    assert sum(len(w.has_what) for w in cluster.scheduler.state.workers.values()) >= 20
    del futures
    gc.collect()
    settle(cluster)
    assert not cluster.scheduler.state.tasks
    deadline = time.monotonic() + 5
    while any(w.data for w in cluster.workers) and time.monotonic() < deadline:
        time.sleep(0.01)  # the scheduler's FreeKeys may still be on the wire
    assert not any(w.data for w in cluster.workers)


def test_why_story_and_scheduler_info(cluster: InMemoryCluster, client: Client) -> None:
    blocker = [
        client.submit(slow_identity, i, 0.5, resources={"GPU": 2}, pure=False) for i in range(2)
    ]
    running, queued = blocker
    tasks = cluster.scheduler.state.tasks
    deadline = time.monotonic() + 10
    while (running.key not in tasks or tasks[running.key].state != "processing") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.01)  # polling until the first one holds both GPUs
    reason = client.why(queued)
    assert "needs GPU=2" in reason and "gpu-a: GPU 0 of 2 free" in reason
    assert "running on gpu-a" in client.why(running)
    assert "not known" in client.why("no-such-key")
    wait(blocker, timeout=10)
    story = client.story(queued)
    assert [row[3] for row in story][:1] == ["queued"]
    assert any(row[3] == "memory" for row in story)
    info = client.scheduler_info()
    pools = {w["name"]: w["resources"] for w in info["workers"].values()}
    assert pools == {"gpu-a": {"GPU": 2.0}, "plain": {}}
    assert 0 < info["started"] <= time.time()  # when it started, as Dask's says
    assert len(client.scheduler_info(n_workers=1)["workers"]) == 1  # Dask's truncation
    assert client.scheduler_info(n_workers=-1)["workers"] == info["workers"]
    with pytest.raises(ValueError, match="positive number of workers or -1"):
        client.scheduler_info(n_workers=0)
    client.wait_for_workers(2, timeout=5)


@pytest.mark.tcp
def test_scheduler_and_worker_classes_sync_and_async() -> None:
    store: dict[str, Any] = {}
    with Scheduler(port=0) as scheduler, Worker(scheduler.address, nthreads=1, data=store) as w:
        with Client(scheduler.address) as c:
            fut = c.submit(operator.add, 20, 22)
            assert fut.result(timeout=10) == 42
            assert store[fut.key] == 42
        assert w.name

    async def main() -> int:
        async with Scheduler(port=0) as s, Worker(s.address, nthreads=1):
            return await asyncio.to_thread(lambda: Client(s.address).submit(abs, -5).result(10))

    assert asyncio.run(main()) == 5


def test_map_pickles_its_function_once(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from apportion.core import payload

    calls: list[object] = []
    real = payload.dumps_function

    def counting(func: Any) -> bytes:
        calls.append(func)
        return real(func)

    monkeypatch.setattr(payload, "dumps_function", counting)

    def local_square(x: int) -> int:  # a fresh function, not in the client's cache
        return x * x

    assert client.gather(client.map(local_square, range(200))) == [x * x for x in range(200)]
    assert calls == [local_square]


def test_testing_exports_the_simulation() -> None:
    from apportion.testing import SimulatedCluster

    sim = SimulatedCluster()
    sim.add_client()
    sim.add_worker("gpus", nthreads=4, resources="gpu0=1 gpu1=1")
    for name, need in [("a", "gpu0=1"), ("b", "gpu0=1"), ("c", "gpu0=1 gpu1=1"), ("d", "gpu1=1")]:
        sim.submit(name, resources=need)
    ends = {iv.key: iv.end for iv in sim.run(dict.fromkeys("abcd", 2.0))}
    assert max(ends.values()) == 6.0 and ends["d"] == 2.0


@pytest.mark.tcp
def test_local_cluster_hands_its_workers_their_units_intact() -> None:
    shape = {"name": "g", "nthreads": 1, "resources": "gpu=[0-1,5] MEMORY=16GiB"}
    cmd = worker_command("tcp://127.0.0.1:1", worker_spec(0, shape))
    assert cmd[cmd.index("--resources") + 1] == "MEMORY=17179869184 gpu=[0,1,5]"
    # Workers of a user process that ended must not wait long for its scheduler.
    assert float(cmd[cmd.index("--reconnect-timeout") + 1]) <= 10
    with LocalCluster(workers=[shape], processes=False) as cluster:
        (worker,) = cluster._workers
        assert worker.units == {"gpu": ["0", "1", "5"]}
        assert worker.supply == {"gpu": 30_000, "MEMORY": 16 * 2**30 * 10_000}


def test_resource_alternatives_and_task_variant(client: Client) -> None:
    from apportion import task_variant

    def which() -> tuple[int, dict[str, Any]]:
        return task_variant(), task_resources()

    # gpu-a has GPU=2 and no "fpga": the first alternative can never run, the second can.
    fut = client.submit(which, resources=[{"fpga": 1}, {"GPU": 1}], pure=False)
    assert fut.result(timeout=10) == (1, {"GPU": 1.0})
    assert client.submit(which, resources=[{"GPU": 1}, {}], pure=False).result(10)[0] == 0
    with pytest.raises(ValueError, match="non-empty list"):
        client.submit(which, resources=[])


def test_an_erred_result_is_released_without_the_garbage_collector(
    client: Client, cluster: InMemoryCluster
) -> None:
    # A raised exception must not tie the futures into a reference cycle: only the
    # collector would free them, and until then the scheduler keeps the errors.
    gc.disable()
    try:
        with pytest.raises(Boom):
            client.submit(explode, 1).result()
        with pytest.raises(Boom):
            client.get({"x": (explode, 2)}, "x")
        with pytest.raises(Boom):
            client.gather([client.submit(explode, 3)])
        assert client.gather([client.submit(slow_identity, 1), client.submit(explode, 4)], "skip")
        assert client.submit(explode, 5).traceback() is not None

        def keep_in_a_local() -> str:
            error = client.submit(explode, 6).exception()
            return str(error)

        assert keep_in_a_local() == "boom 6"
        settle(cluster)
        assert not cluster.scheduler.state.tasks
    finally:
        gc.enable()
