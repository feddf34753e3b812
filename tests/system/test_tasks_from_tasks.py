"""Tasks that submit tasks, as Dask's "Launch Tasks from Tasks" page shows them, with
the import changed; and a GPU task waiting on GPU subtasks, which deadlocks Dask.

Where Dask's worker keeps a seceded task's resources (dask/distributed#6565), a task
here gives them back while it waits: a recursive fan-out of GPU=1 tasks completes on
a single GPU=1 worker with one thread.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import cloudpickle
import pytest

from apportion import (
    Client,
    LocalCluster,
    get_client,
    get_worker,
    rejoin,
    secede,
    task_key,
    task_resources,
    worker_client,
)
from cli_processes import Processes, poll

pytestmark = pytest.mark.process

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --- Dask's examples, the import changed ----------------------------------------------


def fib(n: int) -> int:
    """Dask's example: submit both halves from the task, secede while gathering."""
    if n < 2:
        return n
    client = get_client()
    a_future = client.submit(fib, n - 1)
    b_future = client.submit(fib, n - 2)
    secede()
    a, b = client.gather([a_future, b_future])
    rejoin()
    return int(a + b)


def fib_worker_client(n: int) -> int:
    """The same with ``worker_client``, which secedes for its block."""
    if n < 2:
        return n
    with worker_client() as client:
        a_future = client.submit(fib_worker_client, n - 1)
        b_future = client.submit(fib_worker_client, n - 2)
        a, b = client.gather([a_future, b_future])
    return int(a + b)


def gpu_fan_out(depth: int, width: int) -> int:
    """Each GPU=1 task starts ``width`` GPU=1 subtasks and waits for all of them."""
    assert task_resources() == {"GPU": 1.0}
    if depth == 0:
        return 1
    with worker_client() as client:
        futures = [
            client.submit(gpu_fan_out, depth - 1, width, resources={"GPU": 1}, pure=False)
            for _ in range(width)
        ]
        total = sum(client.gather(futures))
    assert task_resources() == {"GPU": 1.0}  # held again after rejoining
    return int(total) + 1


@pytest.fixture(scope="module")
def one_gpu() -> Iterator[Client]:
    """One worker process, one thread, one GPU: any task holding it while it waits on
    a GPU subtask would wait for ever."""
    with Client(n_workers=1, threads_per_worker=1, resources="GPU=1") as client:
        yield client


@pytest.mark.timeout(60)
def test_dask_fibonacci_with_get_client_secede_and_rejoin(one_gpu: Client) -> None:
    assert one_gpu.submit(fib, 12).result(timeout=50) == 144
    assert one_gpu.submit(fib_worker_client, 10).result(timeout=50) == 55


@pytest.mark.timeout(60)
def test_a_recursive_gpu_fan_out_completes_on_one_gpu(one_gpu: Client) -> None:
    # 1 + 3 + 9 + 27 = 40 tasks, every one holding the only GPU while it runs.
    future = one_gpu.submit(gpu_fan_out, 3, 3, resources={"GPU": 1}, pure=False)
    assert future.result(timeout=50) == 40
    stories = [cause for *_, cause in one_gpu.story(future)]
    assert "seceded on worker-0; gave back GPU=1" in stories
    assert "rejoined on worker-0; holds its resources again" in stories


def nap(seconds: float) -> bool:
    return threading.Event().wait(seconds)


def holds_gpu_while_waiting(seconds: float) -> str:
    with worker_client(keep_resources=True) as client:
        # A plain subtask still runs on the thread this task lent out.
        slept = client.submit(nap, seconds, pure=False).result()
    return f"{slept} {task_resources()}"


@pytest.mark.timeout(60)
def test_keep_resources_holds_the_gpu_while_waiting(one_gpu: Client) -> None:
    keeper = one_gpu.submit(holds_gpu_while_waiting, 1.0, resources={"GPU": 1}, pure=False)
    poll(lambda: "seceded" in str(one_gpu.story(keeper)), 20, "the keeper to secede")
    other = one_gpu.submit(task_key, resources={"GPU": 1}, pure=False)
    assert keeper.result(timeout=30) == "False {'GPU': 1.0}"
    other.result(timeout=30)
    # The other GPU task started only once the keeper was done with the GPU.
    started = [t for t, _, _, new, _ in one_gpu.story(other) if new == "processing"]
    finished = [t for t, _, _, new, _ in one_gpu.story(keeper) if new == "memory"]
    assert started and finished and started[0] >= finished[0]


def task_client_name(_: int) -> str:
    return f"{get_worker().name} {get_client().name} {id(get_client())}"


def task_threads(pause: float) -> int:
    threading.Event().wait(pause)
    return sum(t.name.startswith("apportion-task-") for t in threading.enumerate())


@pytest.mark.timeout(90)
def test_cli_workers_share_one_client_per_worker_and_their_pools_shrink_back(
    procs: Processes,
) -> None:
    address = procs.scheduler()
    for name in ("a", "b"):
        procs.start("worker", address, "--nthreads", "2", "--name", name, "--resources", "GPU=1")
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        names = set(client.gather(client.map(task_client_name, range(40))))
        by_worker: dict[str, set[str]] = {}
        for line in names:
            worker, rest = line.split(" ", 1)
            by_worker.setdefault(worker, set()).add(rest)
        assert set(by_worker) <= {"a", "b"}
        assert all(len(clients) == 1 for clients in by_worker.values()), by_worker
        future = client.submit(gpu_fan_out, 2, 4, resources={"GPU": 1}, pure=False)
        assert future.result(timeout=60) == 21
        assert client.submit(fib, 10).result(timeout=60) == 55
        # Every seceded thread has left again: two task threads per worker.
        counts = client.run(task_threads, 0.0)
        assert sorted(counts.values()) == [2, 2], counts


def compute_with_dask(n: int) -> tuple[str, list[str]]:
    """Dask's own ``compute`` inside ``worker_client`` runs its tasks on the cluster."""
    import dask

    parts = [dask.delayed(task_key)() for _ in range(n)]
    with worker_client():
        keys = list(dask.compute(*parts))
    return task_key(), keys


@pytest.mark.timeout(60)
def test_dask_compute_inside_worker_client_runs_on_the_cluster() -> None:
    pytest.importorskip("dask")
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False)
    with cluster, Client(cluster) as client:
        parent, keys = client.submit(compute_with_dask, 3).result(timeout=30)
    assert len(keys) == 3 and parent not in keys
    assert all(key.startswith("task_key-") for key in keys), keys
