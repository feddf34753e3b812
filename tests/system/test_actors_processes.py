"""Actors on worker processes: indexed GPU units held for an actor's lifetime, and an
actor whose worker is killed fails clearly while the cluster carries on."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator

import cloudpickle
import pytest

from apportion import Client, LostDataError, get_worker, task_resources
from cli_processes import poll

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
