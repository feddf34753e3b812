"""Workers that go silent are declared lost; workers that lose the scheduler come back.

Real processes through the CLI, as in ``test_processes``: a worker frozen with
SIGSTOP under a short ``--worker-timeout``, and a scheduler killed with SIGKILL and
started again on the same port. Every wait polls against a deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from apportion import Client, get_worker
from apportion.client.errors import WorkerCrashedError
from cli_processes import Processes, free_port, poll

pytestmark = pytest.mark.process

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def worker_names(client: Client) -> list[str]:
    return sorted(w["name"] for w in client.scheduler_info()["workers"].values())


def slow_square(x: int) -> int:
    time.sleep(0.1)
    return x * x


def where() -> str:
    return get_worker().name


@pytest.mark.timeout(90)
def test_frozen_worker_is_declared_lost_then_rejoins_once(procs: Processes) -> None:
    _, address, log = procs.start_scheduler("--port", "0", "--worker-timeout", "2")
    beat = ("--heartbeat-interval", "0.2")
    frozen, _ = procs.start(
        "worker", address, "--nthreads", "2", "--name", "frozen", "--resources", "mark=1", *beat
    )
    procs.start("worker", address, "--nthreads", "2", "--name", "steady", *beat)
    with Client(address) as client:
        client.wait_for_workers(2, timeout=20)
        futures = [client.submit(slow_square, i, pure=False) for i in range(60)]

        def frozen_is_busy() -> bool:
            workers = client.scheduler_info()["workers"].values()
            return any(w["name"] == "frozen" and w["processing"] for w in workers)

        poll(frozen_is_busy, 20, "tasks on the worker to freeze")
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            poll(lambda: worker_names(client) == ["steady"], 20, "the frozen worker to be lost")
            assert [f.result(timeout=60) for f in futures] == [i * i for i in range(60)]
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        poll(lambda: worker_names(client) == ["frozen", "steady"], 30, "the worker to rejoin")
        assert client.submit(where, resources={"mark": 1}).result(timeout=30) == "frozen"
        assert client.gather(client.map(slow_square, range(8))) == [i * i for i in range(8)]
        assert frozen.poll() is None
    text = log.read_text()
    # Joined twice, lost once: counted once now, never twice.
    assert len(re.findall(r"worker frozen joined", text)) == 2, text
    assert len(re.findall(r"lost worker frozen", text)) == 1, text


@pytest.mark.timeout(90)
def test_workers_reconnect_to_a_restarted_scheduler(procs: Processes) -> None:
    port = str(free_port())
    scheduler, address, _ = procs.start_scheduler("--port", port)
    workers = [
        procs.start(
            "worker", address, "--nthreads", "2", "--name", name, "--resources", f"{name}=1"
        )
        for name in ("a", "b")
    ]
    with Client(address) as client:
        client.wait_for_workers(2, timeout=20)
        assert client.submit(slow_square, 3).result(timeout=20) == 9
    os.killpg(scheduler.pid, signal.SIGKILL)
    scheduler.wait(10)

    _, again, _ = procs.start_scheduler("--port", port)
    assert again == address
    with Client(address) as client:
        poll(lambda: worker_names(client) == ["a", "b"], 30, "both workers to reconnect")
        ran_on = [client.submit(where, resources={name: 1}) for name in ("a", "b")]
        assert client.gather(ran_on) == ["a", "b"]
        assert client.gather(client.map(slow_square, range(10))) == [i * i for i in range(10)]
    for proc, worker_log in workers:
        assert proc.poll() is None
        assert "reconnected to" in worker_log.read_text()


def hog(megabytes: int, seconds: float) -> int:
    """Hold ``megabytes`` of touched memory for ``seconds``."""
    block = bytearray(megabytes * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)
    return len(block)


@pytest.mark.timeout(90)
def test_a_task_past_the_memory_limit_fails_as_out_of_memory(procs: Processes) -> None:
    _, address, _ = procs.start_scheduler("--port", "0", "--max-worker-deaths", "2")
    small = ("--name", "small", "--memory-limit", "250MiB", "--resources", "small=1")
    procs.start("worker", address, "--nthreads", "1", *small)
    procs.start("worker", address, "--nthreads", "1", "--name", "big")
    with Client(address) as client:
        client.wait_for_workers(2, timeout=20)
        doomed = client.submit(hog, 600, 30.0, resources={"small": 1})
        others = client.map(slow_square, range(20))
        with pytest.raises(WorkerCrashedError) as caught:
            doomed.result(timeout=60)
        message = str(caught.value)
        assert "killed by its supervisor" in message and "out of memory" in message, message
        assert "limit (250.0 MiB)" in message, message
        assert client.gather(others) == [i * i for i in range(20)]
        # The supervisor restarted the worker it killed: both are there to serve.
        poll(lambda: worker_names(client) == ["big", "small-0"], 30, "the restarted worker")
        assert client.submit(hog, 10, 0.0, resources={"small": 1}).result(timeout=30) == 10 * 2**20


def hold_then_square(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return x * x


@pytest.mark.timeout(90)
def test_sigterm_drains_a_worker_its_results_move_and_nothing_runs_twice(
    procs: Processes,
) -> None:
    _, address, _ = procs.start_scheduler("--port", "0")
    leaving, leaving_log = procs.start(
        "worker", address, "--nthreads", "2", "--name", "leaving", "--resources", "here=2"
    )
    procs.start("worker", address, "--nthreads", "2", "--name", "staying")
    with Client(address) as client:
        client.wait_for_workers(2, timeout=20)
        held = client.submit(hold_then_square, 3, 0.0, resources={"here": 1})
        assert held.result(timeout=20) == 9
        running = client.submit(hold_then_square, 4, 2.0, resources={"here": 1})
        poll(lambda: client.why(running).startswith("running"), 20, "the task to start")
        os.killpg(leaving.pid, signal.SIGTERM)
        assert leaving.wait(30) == 0  # drained and left by itself
        assert worker_names(client) == ["staying"]
        assert client.gather([held, running]) == [9, 16]  # from the worker that stayed
        for future in (held, running):
            story = client.story(future)
            assert sum(1 for row in story if row[3] == "processing") == 1, story
            assert any("handed from leaving to staying" in row[4] for row in story), story
    assert "draining" in leaving_log.read_text()


CLIENT_SCRIPT = """
import sys, time
from apportion import Client, task_cancel_event

def stay(x):
    task_cancel_event().wait(60)  # stops early once nobody wants the result
    return x

client = Client(sys.argv[1])
kept = client.scatter(list(range(50)))
finished = client.map(abs, range(-20, 0))
client.gather(finished)
running = client.map(stay, range(4), resources={"slot": 1})
queued = client.map(stay, range(4, 40), resources={"slot": 1})
print("submitted", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(90)
def test_a_killed_client_leaves_an_idle_cluster_with_nothing_held(
    procs: Processes, tmp_path: Path
) -> None:
    _, address, _ = procs.start_scheduler("--port", "0")
    procs.start("worker", address, "--nthreads", "4", "--resources", "slot=4", "--name", "w")
    with Client(address) as observer:
        clients_before = observer.scheduler_info()["clients"]  # this observer included
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    victim = subprocess.Popen(
        [sys.executable, str(script), address], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == b"submitted"
        with Client(address) as observer:
            poll(lambda: observer.scheduler_info()["tasks"].get("processing") == 4, 20, "busy")
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(10)

            def idle() -> bool:
                info = observer.scheduler_info()
                (worker,) = info["workers"].values()
                return (
                    info["clients"] == clients_before
                    and not info["tasks"]
                    and worker["keys"] == 0
                    and worker["nbytes"] == 0
                    and worker["processing"] == 0
                    and worker["free_resources"] == worker["resources"]
                )

            # The running tasks watch their cancel event: their slots return at once.
            poll(idle, 20, "the cluster to be idle and empty")
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        if victim.stdout is not None:
            victim.stdout.close()
