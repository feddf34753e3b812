"""Actors on worker processes: indexed GPU units held for an actor's lifetime, an
actor whose worker is killed fails clearly while the cluster carries on, and actors
calling each other on a worker of one thread (Dask's test_one_thread_deadlock*)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

from apportion import (
    Actor,
    Client,
    LostDataError,
    get_client,
    get_worker,
    task_resources,
)
from cli_processes import Processes, poll

pytestmark = pytest.mark.process

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Model:
    """Stands for a model loaded onto the GPU its task was given."""

    device: object = None
    calls = 0

    def __init__(self) -> None:
        self.device = task_resources()["gpu"]
        self.calls = 0

    def predict(self, x: int) -> tuple[int, object, int]:
        self.calls += 1
        return x * 2, task_resources()["gpu"], os.getpid()

    def nap(self, seconds: float) -> bool:
        return threading.Event().wait(seconds)


@pytest.fixture(scope="module")
def two_gpus() -> Iterator[Client]:
    with Client(n_workers=1, threads_per_worker=2, resources="gpu=[0,1]") as client:
        yield client


@pytest.mark.timeout(60)
def test_actors_hold_their_gpu_units_until_released(two_gpus: Client) -> None:
    client = two_gpus
    first = client.submit(Model, actor=True, resources={"gpu": 1}).result(timeout=30)
    second = client.submit(Model, actor=True, resources={"gpu": 1}).result(timeout=30)
    assert sorted([first.device, second.device]) == [[0], [1]]
    doubled, held, _ = first.predict(21).result(timeout=10)
    assert (doubled, held) == (42, first.device)
    assert first.calls == 1
    waiting = client.submit(task_resources, resources={"gpu": 1}, pure=False)
    assert "gpu" in client.why(waiting)
    freed = first.device
    del first
    assert waiting.result(timeout=30) == {"gpu": freed}
    assert second.predict(1).result(timeout=10)[1] == second.device


def _predict_through(model: Actor, x: int) -> int:
    doubled: int = model.predict(x).result()[0]
    return doubled


@pytest.mark.timeout(60)
def test_a_task_calls_an_actor_passed_to_it_in_a_fresh_worker_process(two_gpus: Client) -> None:
    # The task's worker had loaded no client code: the handle loads what it calls through.
    client = two_gpus
    model = client.submit(Model, actor=True, resources={"gpu": 1}).result(timeout=30)
    assert client.submit(_predict_through, model, 4, pure=False).result(timeout=30) == 8
    del model


@pytest.mark.timeout(90)
def test_an_actor_whose_worker_is_killed_fails_and_the_cluster_carries_on() -> None:
    with Client(n_workers=2, threads_per_worker=1, resources="gpu=[0]") as client:
        future = client.submit(Model, actor=True, resources={"gpu": 1})
        model = future.result(timeout=30)
        pid = model.predict(1).result(timeout=10)[2]
        pending = model.nap(30)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ConnectionError, match="cannot be reached"):
            pending.result(timeout=30)
        poll(lambda: future.status == "error", 30, "the actor's future to fail")
        with pytest.raises(LostDataError, match=r"actor .* was lost"):
            future.result()
        # The other worker, and the GPU of the lost one's replacement, serve on.
        assert client.submit(lambda: get_worker().name, pure=False).result(timeout=30)
        again = client.submit(Model, actor=True, resources={"gpu": 1}).result(timeout=60)
        assert again.predict(2).result(timeout=10)[0] == 4


class Counter:
    n = 0

    def __init__(self) -> None:
        self.n = 0

    def increment(self) -> int:
        self.n += 1
        return self.n


class UsesCounter:
    """Calls an actor of its own worker: the three ways of Dask's deadlock tests."""

    def do_inc(self, ac: Actor) -> int:
        return int(ac.increment().result())

    def do_inc_timeout(self, ac: Actor) -> int:
        return int(ac.increment().result(timeout=0.001))  # done already: cannot expire

    def do_inc_sync_client(self, ac: Actor) -> int:
        return int(get_client().sync(ac.increment))

    def down(self, me: Actor, n: int) -> int:
        # Through its own thread, the inner call would queue behind this one.
        return 0 if n == 0 else 1 + int(me.down(me, n - 1).result(timeout=5))


@pytest.mark.tcp
@pytest.mark.timeout(90)
def test_actors_call_each_other_on_a_cli_worker_of_one_thread(procs: Processes) -> None:
    # A handle passed to a method pickles its class by reference (plain pickle, as
    # Dask's), so the worker imports this module, as a user's worker imports theirs.
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    address = procs.scheduler()
    procs.start("worker", address, "--nthreads", "1", "--name", "solo", env=env)
    with Client(address) as client:
        client.wait_for_workers(1, timeout=30)
        ac = client.submit(Counter, actor=True).result(timeout=30)
        ac2 = client.submit(UsesCounter, actor=True).result(timeout=30)
        assert ac2.do_inc(ac).result(timeout=10) == 1
        assert ac2.do_inc_timeout(ac).result(timeout=10) == 2
        assert ac2.do_inc_sync_client(ac).result(timeout=10) == 3
        assert ac.n == 3
        assert ac2.down(ac2, 3).result(timeout=20) == 3

    async def asynchronous() -> tuple[int, int]:
        async with Client(address, asynchronous=True) as client:
            ac = await client.submit(Counter, actor=True)
            ac2 = await client.submit(UsesCounter, actor=True)
            return await ac2.do_inc_timeout(ac), await ac.n

    assert asyncio.run(asyncio.wait_for(asynchronous(), 60)) == (1, 1)
