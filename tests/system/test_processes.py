"""Real processes started through the CLI, as a user would, talking real TCP.

Kept few: each starts a scheduler and workers. Every process is started in its own
session and killed (with its group) at teardown, even when the test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest

from apportion import Client, get_worker, task_environment
from cli_processes import APPORTION, Processes

pytestmark = pytest.mark.process

# Worker processes are fresh interpreters that cannot import this test module:
# send its functions by value, as functions of a user's script are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*APPORTION, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )


def timed(tag: Any, delay: float) -> dict[str, Any]:
    """A task that records where and when it ran."""
    start = time.time()
    time.sleep(delay)
    return {
        "tag": tag,
        "worker": get_worker().name,
        "pid": os.getpid(),
        "start": start,
        "end": time.time(),
    }


def peak(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = running = 0
    for _, step in edges:
        running += step
        best = max(best, running)
    return best


def test_seed_example_on_cli_started_cluster(procs: Processes) -> None:
    address = procs.scheduler()
    procs.start("worker", address, "--resources", "GPU=2", "--nthreads", "4", "--name", "gpu-a")
    procs.start("worker", address, "--resources", "GPU=2", "--nthreads", "4", "--name", "gpu-b")
    procs.start(
        "worker", address.removeprefix("tcp://"), "--resources", "MEMORY=100e9", "--name", "mem"
    )
    with Client(address) as client:
        client.wait_for_workers(3, timeout=20)
        data = [client.submit(lambda fn: fn.upper(), f"file-{i}") for i in range(10)]
        processed = [client.submit(timed, d, 0.2, resources={"GPU": 1}) for d in data]
        final = client.submit(
            lambda rs: (get_worker().name, sorted(r["tag"] for r in rs)),
            processed,
            resources={"MEMORY": 70e9},
        )
        where, tags = final.result(timeout=60)
        assert where == "mem"
        assert tags == sorted(f"FILE-{i}" for i in range(10))
        records = client.gather(processed)
        by_worker: dict[str, list[tuple[float, float]]] = {}
        for r in records:
            by_worker.setdefault(r["worker"], []).append((r["start"], r["end"]))
        assert set(by_worker) <= {"gpu-a", "gpu-b"}
        assert all(peak(iv) <= 2 for iv in by_worker.values()), by_worker

        # The CLI views of a running cluster.
        info = run_cli("info", "--scheduler", address)
        assert info.returncode == 0, info.stderr
        assert "gpu-a" in info.stdout and "GPU 2/2 free" in info.stdout
        hogs = [client.submit(timed, i, 1.0, resources={"GPU": 2}, pure=False) for i in range(3)]
        deadline = time.monotonic() + 10
        while client.scheduler_info()["tasks"].get("processing", 0) < 2:
            assert time.monotonic() < deadline, client.scheduler_info()["tasks"]
            time.sleep(0.02)  # polling until two hogs hold both GPU workers
        waiting = [f for f in hogs if "queued" in client.why(f)]
        assert len(waiting) == 1, [client.why(f) for f in hogs]
        why = run_cli("why", waiting[0].key, "--scheduler", address)
        assert why.returncode == 0, why.stderr
        assert "GPU 0 of 2 free" in why.stdout
        client.gather(hogs)


def test_unsatisfiable_request_warns_on_a_growable_cluster(procs: Processes) -> None:
    address = procs.scheduler()
    procs.start("worker", address, "--resources", "GPU=2", "--name", "small")
    with Client(address) as client:
        client.wait_for_workers(1, timeout=20)
        fut = client.submit(abs, -1, resources={"GPU": 5})
        deadline = time.monotonic() + 10
        while not client.notices and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.notices and "GPU=5" in client.notices[0]
        assert "largest GPU supply is 2 on small" in client.notices[0]
        assert "largest GPU supply is 2" in client.why(fut)
        assert not fut.done()
        # A suitable worker joining lets it run.
        procs.start("worker", address, "--resources", "GPU=8", "--name", "big")
        assert fut.result(timeout=30) == 1


def test_nworkers_process_resource_runs_each_task_in_its_own_process(procs: Processes) -> None:
    address = procs.scheduler()
    procs.start("worker", address, "--nworkers", "3", "--nthreads", "2", "--resources", "process=1")
    with Client(address) as client:
        client.wait_for_workers(3, timeout=30)
        futures = [client.submit(timed, i, 0.3, resources={"process": 1}) for i in range(9)]
        records = client.gather(futures)
    assert peak([(r["start"], r["end"]) for r in records]) <= 3
    assert len({r["pid"] for r in records}) == 3
    for a in records:
        for b in records:
            if a is not b and a["start"] < b["end"] and b["start"] < a["end"]:
                assert a["pid"] != b["pid"], "two tasks overlapped in one process"


def test_supervisor_restarts_a_worker_killed_with_sigkill(procs: Processes) -> None:
    address = procs.scheduler()
    procs.start("worker", address, "--nworkers", "2", "--nthreads", "1")
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        pids = {w["pid"] for w in client.scheduler_info()["workers"].values()}
        victim = sorted(pids)[0]
        os.kill(victim, signal.SIGKILL)
        _replaced(client, victim)
        assert client.gather(client.map(abs, range(-10, 0))) == list(range(10, 0, -1))


def where_am_i() -> dict[str, Any]:
    """A task that says which process ran it, under which parent and environment."""
    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "group": os.getpgid(0),
        "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "sigint": str(signal.getsignal(signal.SIGINT)),
    }


def test_forkserver_workers_run_tasks_restart_and_leave_nothing_behind(
    procs: Processes,
) -> None:
    """``--start-method forkserver``: two workers forked from one server, each running
    tasks in the environment a fresh process gets; one SIGKILLed is replaced; SIGTERM
    to the supervisor ends every process under it."""
    address = procs.scheduler()
    supervisor, log = procs.start(
        "worker", address, "--nworkers", "2", "--nthreads", "1", "--start-method", "forkserver"
    )
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        workers = {w["name"]: w["pid"] for w in client.scheduler_info()["workers"].values()}
        seen = {
            name: client.submit(where_am_i, workers=[name], pure=False).result(timeout=30)
            for name in workers
        }
        server = psutil.Process(supervisor.pid).children()
        assert len(server) == 1, server
        for name, facts in seen.items():
            assert facts["pid"] == workers[name]
            assert facts["parent"] == server[0].pid
            assert facts["group"] == os.getpgid(supervisor.pid)
            assert facts["trim"] == "65536"
            # The worker's own handlers, installed on its loop, are not Python's:
            # what matters is that the server's SIG_IGN did not leak into the child.
            assert facts["sigint"] != str(signal.SIG_IGN)
        assert server[0].environ()["MALLOC_TRIM_THRESHOLD_"] == "65536"
        victim = sorted(workers.values())[0]
        os.kill(victim, signal.SIGKILL)
        _replaced(client, victim)
        assert client.gather(client.map(abs, range(-10, 0))) == list(range(10, 0, -1))
        family = [psutil.Process(supervisor.pid)]
        family += family[0].children(recursive=True)
        assert len(family) == 4
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, log.read_text()
    deadline = time.monotonic() + 10
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family):
        assert time.monotonic() < deadline, f"left behind: {family}"
        time.sleep(0.05)


def test_sigkill_of_a_busy_worker_loses_no_accepted_work(procs: Processes) -> None:
    """A 202-task graph (100 leaves summed pairwise, level by level, to one root) with
    one of two workers SIGKILLed half-way: every value right, recomputation counted."""
    address = procs.scheduler()
    procs.start("worker", address, "--nthreads", "2", "--name", "victim")
    procs.start("worker", address, "--nthreads", "2", "--name", "survivor")
    with Client(address) as client:
        client.wait_for_workers(2, timeout=20)
        pids = {w["name"]: w["pid"] for w in client.scheduler_info()["workers"].values()}
        leaves = [client.submit(slow_square, i, pure=False) for i in range(100)]
        levels = [leaves]
        while len(levels[-1]) > 1:
            below = levels[-1]
            levels.append([client.submit(sum, below[i : i + 2]) for i in range(0, len(below), 2)])
        futures = [f for level in levels for f in level]
        assert len(futures) == 202
        leaves[50].result(timeout=30)  # about half-way, work under way on both workers
        os.kill(pids["victim"], signal.SIGKILL)
        assert levels[-1][0].result(timeout=60) == sum(i * i for i in range(100))
        assert client.gather(leaves) == [i * i for i in range(100)]
        runs = [sum(1 for row in client.story(f) if row[3] == "processing") for f in futures]
        recomputed = sum(1 for n in runs if n > 1)
        # At least what was running on the victim ran again; never more than every task.
        assert 1 <= recomputed < 202, runs
        print(f"recomputed {recomputed} of 202 tasks after the SIGKILL")
        info = client.scheduler_info()
        assert [w["name"] for w in info["workers"].values()] == ["survivor"]
        assert client.submit(abs, -3).result(timeout=10) == 3


def slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def test_malformed_resource_specs_exit_2_with_one_line(procs: Processes) -> None:
    for spec in ["GPU", "GPU=-1", "GPU=abc", "=2"]:
        result = run_cli("worker", "tcp://127.0.0.1:1", "--resources", spec)
        assert result.returncode == 2, (spec, result)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert spec in lines[0] or "amount" in lines[0]


def test_script_without_main_guard_runs_on_a_process_cluster(tmp_path: Path) -> None:
    script = tmp_path / "plain_script.py"
    script.write_text(
        textwrap.dedent(
            """
            from apportion import Client, LocalCluster

            def square(x):
                return x * x

            cluster = LocalCluster(n_workers=1, threads_per_worker=1)
            client = Client(cluster)
            print("result", client.submit(square, 7).result(timeout=30))
            client.close()
            cluster.close()

            with Client() as default:  # an embedded cluster sized to the machine
                print("default", default.gather(default.map(square, [1, 2, 3])))
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "result 49" in result.stdout
    assert "default [1, 4, 9]" in result.stdout


def cuda_devices_together(barrier: str, n: int) -> str:
    """What a command started by this task would see as its GPUs, once ``n`` such run.

    Waiting for the others makes the tasks hold their units at the same time, so
    they must be on different processes whatever order placement takes them in.
    """
    Path(barrier, str(os.getpid())).touch()
    deadline = time.monotonic() + 20
    while len(os.listdir(barrier)) < n:
        assert time.monotonic() < deadline, "the other task never started"
        time.sleep(0.01)  # polling for the condition
    return task_environment()["CUDA_VISIBLE_DEVICES"]


def test_split_units_gives_each_process_its_own_gpus(procs: Processes, tmp_path: Path) -> None:
    address = procs.scheduler()
    procs.start(
        "worker", address, "--nworkers", "2", "--split-units", "--resources", "gpu=[0-3]",
        "--nthreads", "2", "--name", "split",
    )  # fmt: skip
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        units = {w["name"]: w["units"] for w in client.scheduler_info()["workers"].values()}
        assert units == {
            "split-0": {"gpu": {"0": 1.0, "1": 1.0}},
            "split-1": {"gpu": {"2": 1.0, "3": 1.0}},
        }
        info = run_cli("info", "--scheduler", address)
        assert info.returncode == 0, info.stderr
        assert "gpu [0:free 1:free]" in info.stdout and "gpu [2:free 3:free]" in info.stdout
        barrier = tmp_path / "running"
        barrier.mkdir()
        futures = [
            client.submit(cuda_devices_together, str(barrier), 2, pure=False, resources={"gpu": 2})
            for _ in range(2)
        ]
        assert sorted(client.gather(futures)) == ["0,1", "2,3"]


def _replaced(client: Client, victim: int) -> None:
    """Wait until the supervisor replaced the worker process ``victim`` (two again)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = {w["pid"] for w in client.scheduler_info()["workers"].values()}
        if len(now) == 2 and victim not in now:
            return
        time.sleep(0.05)
    raise AssertionError(f"no replacement for {victim}: {now}")
