"""The --nworkers supervisor: policy with a fake spawner and fake monotonic time, plus one
real run."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Literal

import psutil
import pytest

from apportion.protocol.worker import WorkerDied
from apportion.worker.supervisor import Supervisor, describe_exit, popen_spawn, worker_environment
from supervisor_fakes import FakeMonotonic, FakeSpawner


def make(n: int = 2, **kwargs: bool) -> tuple[Supervisor, FakeSpawner, FakeMonotonic]:
    spawner, monotonic = FakeSpawner(**kwargs), FakeMonotonic()
    commands = [["worker", f"--name=w-{i}"] for i in range(n)]
    supervisor = Supervisor(commands, spawner, monotonic, min_uptime=10.0, max_backoff=30.0)
    supervisor.start()
    return supervisor, spawner, monotonic


@pytest.mark.timeout(5)
def test_starts_one_process_per_command() -> None:
    _, spawner, _ = make(3)
    assert [p.argv for p in spawner.spawned] == [["worker", f"--name=w-{i}"] for i in range(3)]


@pytest.mark.timeout(5)
def test_child_killed_by_sigkill_is_restarted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    supervisor, spawner, monotonic = make(2)
    monotonic.now += 60
    spawner.spawned[0].returncode = -signal.SIGKILL
    with caplog.at_level(logging.WARNING, logger="apportion.supervisor"):
        supervisor.poll()
    assert len(spawner.spawned) == 3
    assert spawner.spawned[2].argv == ["worker", "--name=w-0"]
    assert supervisor.slots[0].process is spawner.spawned[2]
    assert "was killed by SIGKILL" in caplog.text


@pytest.mark.timeout(5)
def test_children_that_keep_dying_are_restarted_with_growing_delays() -> None:
    supervisor, spawner, monotonic = make(1)
    delays = []
    for _ in range(5):
        spawner.spawned[-1].returncode = 1
        before, start = len(spawner.spawned), monotonic.now
        supervisor.poll()
        while len(spawner.spawned) == before:
            monotonic.now += 0.5
            supervisor.poll()
        delays.append(monotonic.now - start)
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0]  # the first restart is immediate


@pytest.mark.timeout(5)
def test_stop_forwards_the_signal_and_does_not_restart() -> None:
    supervisor, spawner, _ = make(2)
    supervisor.stop(signal.SIGINT)
    assert [p.signals for p in spawner.spawned] == [[signal.SIGINT], [signal.SIGINT]]
    supervisor.poll()
    assert len(spawner.spawned) == 2


@pytest.mark.timeout(5)
def test_stop_kills_children_that_ignore_the_signal() -> None:
    supervisor, spawner, _ = make(1, stubborn=True)
    supervisor.stop(signal.SIGTERM, timeout=0.0)
    assert spawner.spawned[0].returncode == -signal.SIGKILL


@pytest.mark.timeout(5)
def test_exit_descriptions() -> None:
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(-signal.SIGTERM) == "was killed by SIGTERM"


@pytest.fixture
def reaper() -> Iterator[list[psutil.Process]]:
    """Processes registered here are killed after the test, even if it failed."""
    processes: list[psutil.Process] = []
    yield processes
    for process in processes:
        try:
            process.kill()
            process.wait(5)
        except psutil.NoSuchProcess:
            pass


@pytest.mark.process
@pytest.mark.timeout(30)
def test_real_child_killed_with_sigkill_is_restarted(reaper: list[psutil.Process]) -> None:
    def launch(argv: list[str]) -> subprocess.Popen[bytes]:
        process = popen_spawn(argv)
        reaper.append(psutil.Process(process.pid))
        assert isinstance(process, subprocess.Popen)
        return process

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = Supervisor([sleeper, sleeper], launch)
    supervisor.start()
    victim = supervisor.slots[0].process
    assert victim is not None
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    supervisor.poll()
    replacement = supervisor.slots[0].process
    assert replacement is not None and replacement.pid != victim.pid
    assert replacement.poll() is None
    supervisor.stop(signal.SIGTERM, timeout=10)
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in reaper)
    assert len(reaper) == 3


# --- stopped children, memory limits and death reports -------------------------------


class Reports:
    def __init__(self) -> None:
        self.got: list[tuple[str, int, str]] = []
        #: Whether each report said the worker died of its memory, in order.
        self.out_of_memory: list[bool] = []

    def __call__(self, report: WorkerDied) -> None:
        self.got.append((report.name, report.pid, report.description))
        self.out_of_memory.append(bool(report.out_of_memory))


def make_limited(
    memory: dict[int, int], limit: int = 1000, terminate: float | Literal[False] = 0.95
) -> tuple[Supervisor, FakeSpawner, FakeMonotonic, Reports]:
    spawner, monotonic, reports = FakeSpawner(), FakeMonotonic(), Reports()
    supervisor = Supervisor(
        [["worker", "--name=w-0"]],
        spawner,
        monotonic,
        names=["w-0"],
        memory_limit=limit,
        memory_terminate=terminate,
        memory_of=lambda pid: memory.get(pid, 0),
        report=reports,
    )
    supervisor.start()
    return supervisor, spawner, monotonic, reports


@pytest.mark.timeout(5)
def test_a_child_above_its_memory_limit_is_killed_restarted_and_reported() -> None:
    memory = {1000: 900}
    supervisor, spawner, monotonic, reports = make_limited(memory)
    supervisor.poll()
    assert spawner.spawned[0].returncode is None  # 900 of 1000: fine
    memory[1000] = 1200
    supervisor.poll()
    assert spawner.spawned[0].returncode == -signal.SIGKILL
    monotonic.now += 60
    supervisor.poll()
    assert len(spawner.spawned) == 2  # restarted
    ((name, pid, how),) = reports.got
    assert (name, pid) == ("w-0", 1000)
    assert "killed by its supervisor" in how and "out of memory" in how and "1.2 KiB" in how
    assert reports.out_of_memory == [True]


@pytest.mark.timeout(5)
def test_the_child_is_killed_above_the_terminate_fraction_of_its_limit() -> None:
    memory = {1000: 950}
    supervisor, spawner, _, reports = make_limited(memory)
    supervisor.poll()
    assert spawner.spawned[0].returncode is None  # at 95%: not above it
    memory[1000] = 951
    supervisor.poll()
    assert spawner.spawned[0].returncode == -signal.SIGKILL
    supervisor.poll()
    assert "passed 95% of its limit (1000 B)" in reports.got[0][2]
    memory = {1000: 850}
    supervisor, spawner, _, _ = make_limited(memory, terminate=0.8)
    supervisor.poll()
    assert spawner.spawned[0].returncode == -signal.SIGKILL


@pytest.mark.timeout(5)
def test_with_terminate_off_the_supervisor_never_kills_for_memory() -> None:
    memory = {1000: 5000}
    supervisor, spawner, _, reports = make_limited(memory, terminate=False)
    supervisor.poll()
    assert spawner.spawned[0].returncode is None and not reports.got
    spawner.spawned[0].returncode = -signal.SIGKILL  # the kernel's OOM killer, say
    supervisor.poll()
    assert "likely out of memory" in reports.got[0][2]  # the readings still date it
    assert reports.out_of_memory == [True]


@pytest.mark.timeout(5)
def test_a_sigkill_near_the_limit_is_likely_out_of_memory() -> None:
    memory = {1000: 950}
    supervisor, spawner, _, reports = make_limited(memory)
    supervisor.poll()
    spawner.spawned[0].returncode = -signal.SIGKILL  # the kernel's OOM killer, say
    supervisor.poll()
    assert "was killed by SIGKILL - likely out of memory" in reports.got[0][2]
    assert reports.out_of_memory == [True]


@pytest.mark.timeout(5)
def test_a_sigkill_far_from_the_limit_or_a_crash_is_not_out_of_memory() -> None:
    memory = {1000: 500}
    supervisor, spawner, monotonic, reports = make_limited(memory)
    supervisor.poll()
    spawner.spawned[0].returncode = -signal.SIGKILL  # someone's kill -9
    supervisor.poll()
    monotonic.now += 60
    supervisor.poll()
    memory[1001] = 920
    supervisor.poll()
    spawner.spawned[1].returncode = 1  # near the limit, but it exited by itself
    supervisor.poll()
    assert [how for _, _, how in reports.got] == ["was killed by SIGKILL", "exited with status 1"]
    assert reports.out_of_memory == [False, False]


@pytest.mark.timeout(5)
def test_a_child_that_exits_with_status_0_was_stopped_and_is_not_restarted() -> None:
    supervisor, spawner, monotonic, reports = make_limited({})
    spawner.spawned[0].returncode = 0  # drained after its own SIGTERM
    monotonic.now += 60
    supervisor.poll()
    supervisor.poll()
    assert len(spawner.spawned) == 1 and supervisor.all_stopped
    assert reports.got == []  # a stop is not a death: nothing to tell the scheduler


@pytest.mark.timeout(5)
def test_worker_processes_get_a_low_malloc_trim_threshold_unless_told_otherwise() -> None:
    assert worker_environment({"HOME": "/h"}) == {"HOME": "/h", "MALLOC_TRIM_THRESHOLD_": "65536"}
    assert worker_environment({"MALLOC_TRIM_THRESHOLD_": "0"})["MALLOC_TRIM_THRESHOLD_"] == "0"
