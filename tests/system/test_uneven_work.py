"""Uneven work on real worker processes: no task waits behind a long one while a
thread elsewhere is idle.

Two shapes a new user meets first. Six sleeps, one long and five short, on two
single-thread workers: no short task may start after the long one has ended (each
has the other worker to run on meanwhile), whether the long task comes first or
second. And Dask's "Submit Tasks
from Tasks" example, a task that calls ``get_client()``, submits two tiny tasks and
waits for them without seceding: it must finish on every way of starting a cluster,
even though the waiting task holds its worker's only thread, so its subtasks must
run on the other worker.

The checks are on what happened, never on a speed figure: each sleep reports its
own process and wall-clock span (every worker runs on this machine, so
``time.time()`` is one clock), and a hang is a ``TimeoutError`` after a few seconds
that names where the scheduler left each task.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from apportion import Client, LocalCluster, get_client, worker_client
from cli_processes import Processes

pytestmark = [pytest.mark.process, pytest.mark.tcp]

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: The long sleep and the short ones: five short ones (1 s) fit in one long one (2 s)
#: with a second to spare for the round trips of a loaded 2-core machine.
LONG = 2.0
SHORT = 0.2

#: How long a tasks-from-tasks example may take. Healthy, it takes milliseconds;
#: stuck, its subtasks wait for ever behind it, and this turns that into an error.
EXAMPLE_TIMEOUT = 5.0

#: Runs of the example in a row on one cluster: from the second on the scheduler
#: has measured the subtasks as short, the case where it would queue one behind the
#: task that waits for it.
RUNS = 3


# --- what the tasks run ---------------------------------------------------------------


def timed_sleep(seconds: float) -> tuple[int, float, float]:
    """Sleep; this process and the wall-clock start and end of the sleep."""
    start = time.time()
    threading.Event().wait(seconds)
    return os.getpid(), start, time.time()


def inc(x: int) -> int:
    return x + 1


def gathers_two_subtasks(x: int) -> int:
    """Dask's "Submit Tasks from Tasks" example: no ``secede``, no ``worker_client``."""
    client = get_client()
    a = client.submit(inc, x)
    b = client.submit(inc, x + 1)
    a, b = client.gather([a, b])
    return int(a + b)


def waits_on_each_subtask(x: int) -> int:
    """The same, waiting on each future's ``result()`` in turn."""
    client = get_client()
    a = client.submit(inc, x)
    b = client.submit(inc, x + 1)
    return int(a.result() + b.result())


def gathers_inside_worker_client(x: int) -> int:
    """The same inside ``worker_client()``, which secedes while the task waits."""
    with worker_client() as client:
        a = client.submit(inc, x)
        b = client.submit(inc, x + 1)
        a, b = client.gather([a, b])
    return int(a + b)


def computes_with_dask(x: int) -> int:
    """The same shape with Dask's own ``compute`` of two delayed calls, no ``secede``,
    on whatever scheduler Dask has inside the task (apportion keeps an unseceded
    task's ``compute`` off the cluster: client/dask_default.py)."""
    import dask

    get_client()
    a, b = dask.compute(dask.delayed(inc)(x), dask.delayed(inc)(x + 1))
    return int(a + b)


def computes_with_dask_on_the_cluster(x: int) -> int:
    """The same with the task's client named as Dask's scheduler: the two calls run
    as tasks of the cluster while this one waits on its thread."""
    import dask

    a, b = dask.compute(dask.delayed(inc)(x), dask.delayed(inc)(x + 1), scheduler=get_client())
    return int(a + b)


# --- checks -----------------------------------------------------------------------------


def finishes(client: Client, future: Any, what: str, timeout: float = EXAMPLE_TIMEOUT) -> Any:
    """The future's result within ``timeout`` seconds; else a ``TimeoutError`` that
    names the tasks each worker holds."""
    try:
        return future.result(timeout=timeout)
    except TimeoutError as error:
        raise TimeoutError(
            f"{what} did not finish in {timeout}s; tasks on each worker: {client.processing()}"
        ) from error


def runs_the_example(client: Client, task: Any) -> None:
    """``task`` finishes ``RUNS`` times in a row on ``client``'s cluster."""
    for run in range(RUNS):
        x = 10 * run
        future = client.submit(task, x, pure=False)
        assert finishes(client, future, f"run {run + 1} of {task.__name__}") == 2 * x + 3


def sleeps_in_order(client: Client, seconds: list[float]) -> list[tuple[float, int, float, float]]:
    """Submit one sleep per entry of ``seconds``, in order; (seconds, process, start,
    end) for each, in the same order."""
    futures = [client.submit(timed_sleep, s, pure=False) for s in seconds]
    # Generous: done one after another, all the sleeps take LONG + 5 * SHORT.
    wait = sum(seconds) + EXAMPLE_TIMEOUT
    return [
        (s, *finishes(client, f, f"a {s}s sleep", wait))
        for s, f in zip(seconds, futures, strict=True)
    ]


def no_short_sleep_after_the_long_one(spans: list[tuple[float, int, float, float]]) -> None:
    """Every short sleep started before the long one ended: none waited behind it."""
    (long_end,) = [end for s, _, _, end in spans if s == LONG]
    first = min(start for _, _, start, _ in spans)
    waited = [span for span in spans if span[0] == SHORT and span[2] >= long_end]
    timeline = "\n".join(
        f"  {s}s on pid {pid}: {start - first:.2f} to {end - first:.2f}"
        for s, pid, start, end in spans
    )
    assert not waited, (
        f"short sleeps that started after the long one ended at {long_end - first:.2f}s: "
        f"{len(waited)}\n{timeline}"
    )


# --- clusters ---------------------------------------------------------------------------


@pytest.fixture
def two_workers() -> Iterator[Client]:
    """Two worker processes of one thread each, as a 2-core machine gets by default."""
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    with cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=30)
        yield client


# --- six sleeps, one long ---------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "seconds",
    [
        pytest.param([LONG] + [SHORT] * 5, id="long-first"),
        pytest.param([SHORT, LONG] + [SHORT] * 4, id="long-second"),
    ],
)
def test_no_short_task_starts_after_the_long_one_ends(
    two_workers: Client, seconds: list[float]
) -> None:
    spans = sleeps_in_order(two_workers, seconds)
    no_short_sleep_after_the_long_one(spans)


# --- Dask's "Submit Tasks from Tasks" example, without secede ---------------------------


@pytest.mark.timeout(40)
def test_the_example_finishes_on_the_default_client(default_client: Client) -> None:
    # Client() starts the cluster Dask's rules give this machine: two workers of one
    # thread on two cores. Elsewhere that shape is asked for by name.
    assert sorted(default_client.nthreads().values()) == [1, 1]
    runs_the_example(default_client, gathers_two_subtasks)


@pytest.mark.timeout(40)
def test_the_example_finishes_on_a_local_cluster(two_workers: Client) -> None:
    runs_the_example(two_workers, gathers_two_subtasks)


@pytest.mark.timeout(40)
def test_the_example_with_result_on_each_future_finishes(two_workers: Client) -> None:
    runs_the_example(two_workers, waits_on_each_subtask)


@pytest.mark.timeout(40)
def test_the_example_inside_worker_client_finishes(two_workers: Client) -> None:
    runs_the_example(two_workers, gathers_inside_worker_client)


@pytest.mark.timeout(40)
@pytest.mark.parametrize(
    "task",
    [
        pytest.param(computes_with_dask, id="dask-default-scheduler"),
        pytest.param(computes_with_dask_on_the_cluster, id="scheduler=get_client()"),
    ],
)
def test_the_example_with_dask_compute_finishes(two_workers: Client, task: Any) -> None:
    pytest.importorskip("dask", reason="Dask's own compute needs dask installed")
    runs_the_example(two_workers, task)


@pytest.mark.timeout(60)
def test_the_example_finishes_on_cli_workers(procs: Processes) -> None:
    with Client(procs.two_workers()) as client:
        client.wait_for_workers(2, timeout=30)
        runs_the_example(client, gathers_two_subtasks)
