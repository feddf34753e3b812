"""A task that kills its worker every time fails after a few deaths; the cluster goes on."""

from __future__ import annotations

import os
import signal
import sys

import cloudpickle
import pytest

from apportion import Client, WorkerCrashedError
from cli_processes import Processes

pytestmark = pytest.mark.process

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def exit_hard() -> None:
    os._exit(1)


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize(
    ("poison", "death"),
    [(exit_hard, "(exited with status 1)"), (kill_self, "(was killed by SIGKILL)")],
)
def test_poison_task_fails_after_three_worker_deaths(
    procs: Processes, poison: object, death: str
) -> None:
    """The supervisor tells the scheduler how each worker died; the error says it."""
    address = procs.scheduler()
    procs.start("worker", address, "--nworkers", "2", "--nthreads", "1")
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        fut = client.submit(poison, pure=False)  # type: ignore[arg-type]
        with pytest.raises(WorkerCrashedError, match="3 workers that died") as info:
            fut.result(timeout=60)
        assert str(info.value).count(death) == 3, info.value
        client.wait_for_workers(1, timeout=30)  # the supervisor restarts the dead
        assert client.gather(client.map(abs, [-1, -2, -3])) == [1, 2, 3]
