"""``apportion worker``: option checking in-process, and one real supervised run."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import click
import psutil
import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from apportion.cli.worker import check_resources
from apportion.cli.worker import worker as worker_command
from apportion.loop_thread import LoopThread
from apportion.protocol.messages import WorkerClosing
from test_worker_service import FakeScheduler


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "spec", ["GPU", "GPU=-1", "GPU=abc", "=2", "gpu=[0,1", "gpu=[]", "gpu=[3-1]", "gpu=[0,0]"]
)
def test_malformed_resources_exit_with_status_2_and_one_line(spec: str) -> None:
    result = CliRunner().invoke(main, ["worker", "tcp://127.0.0.1:8786", "--resources", spec])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--resources" in errors[0]
    assert len(result.output.splitlines()) == 1


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "spec", ["gpu=[0,1,2,3]", "gpu=[0-7]", "gpu=[0-1,6] MEMORY=16GiB", "GPU=2,gpu=[0, 1]"]
)
def test_indexed_pools_are_accepted_and_passed_on_as_written(spec: str) -> None:
    ctx = click.Context(worker_command)
    param = next(p for p in worker_command.params if p.name == "resources")
    assert check_resources(ctx, param, spec) == spec


@pytest.mark.timeout(10)
def test_help_lists_the_worker_options() -> None:
    result = CliRunner().invoke(main, ["worker", "--help"])
    assert result.exit_code == 0
    for option in ("--nthreads", "--nworkers", "--nprocs", "--resources", "--name", "--port"):
        assert option in result.output


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


@pytest.mark.process
@pytest.mark.timeout(45)
def test_nworkers_runs_supervised_workers_that_stop_on_sigterm(loop_thread: LoopThread) -> None:
    scheduler = loop_thread.run(FakeScheduler().start())
    argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler.address]
    argv += ["--nworkers", "2", "--nthreads", "1", "--name", "box"]
    argv += ["--resources", "GPU=1 gpu=[0-1,5]"]
    supervisor = subprocess.Popen(argv, stderr=subprocess.PIPE)
    family = [psutil.Process(supervisor.pid)]
    try:
        hellos = [loop_thread.run(scheduler.next_worker(), 20)[1] for _ in range(2)]
        assert sorted(h.name for h in hellos) == ["box-0", "box-1"]
        assert all(h.resources == {"GPU": 10_000, "gpu": 30_000} for h in hellos)
        assert all(h.units == {"gpu": ["0", "1", "5"]} and h.nthreads == 1 for h in hellos)
        family += family[0].children(recursive=True)
        assert len(family) == 3
        supervisor.send_signal(signal.SIGTERM)
        _, stderr = supervisor.communicate(timeout=20)
        assert supervisor.returncode == 0, stderr.decode()
        assert "SIGTERM received; closing" in stderr.decode()
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
    finally:
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        supervisor.wait(5)
        loop_thread.run(scheduler.close(), 5)


@pytest.mark.process
@pytest.mark.timeout(45)
def test_workers_stop_when_their_supervisor_is_killed(loop_thread: LoopThread) -> None:
    """SIGKILL leaves the supervisor no chance to stop its children; they notice alone."""
    scheduler = loop_thread.run(FakeScheduler().start())
    argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler.address]
    argv += ["--nworkers", "2", "--nthreads", "1", "--name", "orphan"]
    # Own session, so that the test runner's process group is not involved.
    supervisor = subprocess.Popen(argv, stderr=subprocess.PIPE, start_new_session=True)
    family = [psutil.Process(supervisor.pid)]
    try:
        conns = [loop_thread.run(scheduler.next_worker(), 20)[0] for _ in range(2)]
        children = family[0].children(recursive=True)
        family += children
        assert len(children) == 2
        supervisor.kill()
        assert supervisor.wait(10) == -signal.SIGKILL
        # Both leave deliberately: the scheduler hears WorkerClosing, not a lost connection.
        for conn in conns:
            loop_thread.run(scheduler.expect(conn, WorkerClosing), 10)
        deadline = time.monotonic() + 10
        while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
            assert time.monotonic() < deadline, "orphaned workers still running"
            time.sleep(0.05)  # polling for the exit, not waiting for it to happen
        _, stderr = supervisor.communicate(timeout=10)  # EOF: every writer has exited
        assert stderr.decode().count(f"supervisor {supervisor.pid} is gone; stopping") == 2, stderr
    finally:
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        supervisor.communicate(timeout=5)  # reaps it and closes the pipe
        loop_thread.run(scheduler.close(), 5)
