"""Indexed GPU units, end to end: worker processes whose tasks start processes of their own.

No GPU exists here; the indexed pool ``gpu=[0,1,2,3]`` is the fake. Every task starts
a child with ``apportion.task_environment()``; the child prints the
``CUDA_VISIBLE_DEVICES`` it sees and holds its units briefly. Each assertion is made
from the start and end times the tasks record and the labels their children printed,
never from wall-clock limits.

Recorded intervals lie inside the scheduler's hold of the units (taken before the task
starts, given back after it ends), so two recorded intervals that overlap are
two holds that overlapped: anything shared between them was shared for real.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import cloudpickle
import psutil
import pytest

from apportion import Client, LocalCluster, get_worker, task_environment, task_resources, wait

pytestmark = pytest.mark.process

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

LABELS = {"0", "1", "2", "3"}

#: What a task's child runs: report what it was given, then hold it for argv[1] seconds.
CHILD = (
    "import os, sys, time; "
    "print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('APPORTION_RESOURCE_GPU'),"
    " sep='|', flush=True); "
    "time.sleep(float(sys.argv[1]))"
)


class Run(NamedTuple):
    """One task as it recorded itself (built on the client from the task's tuple)."""

    gpu: float  #: the amount asked for
    seen: list[str]  #: the labels in the child's CUDA_VISIBLE_DEVICES
    pool_variable: str  #: the child's APPORTION_RESOURCE_GPU
    held: dict[str, Any]  #: task_resources() inside the task
    start: float
    end: float
    worker: str


def use_gpus(
    tag: int, hold: float, rendezvous: str | None = None, expected: int = 0
) -> tuple[Any, ...]:
    """Start a child under the task's environment; report what it saw, when, and where.

    With ``rendezvous``, first wait (bounded) until ``expected`` tasks have arrived,
    so that all of them certainly hold their units at once.
    """
    held = task_resources()
    arrived = _meet(Path(rendezvous), tag, expected) if rendezvous else True
    start = time.time()
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(hold)],
        env=task_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    end = time.time()
    return child.stdout.strip(), held, start, end, get_worker().name, arrived


def _meet(folder: Path, tag: int, expected: int) -> bool:
    (folder / str(tag)).touch()
    deadline = time.monotonic() + 10
    while len(list(folder.iterdir())) < expected:
        if time.monotonic() > deadline:
            return False  # reported, so the test fails saying why instead of hanging
        time.sleep(0.005)  # polling the folder: tasks in one worker share no other channel
    return True


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    workers = [{"name": "gpus", "nthreads": 4, "resources": "gpu=[0,1,2,3]"}]
    with LocalCluster(workers=workers, processes=True) as cluster, Client(cluster) as c:
        pids = [w["pid"] for w in c.scheduler_info()["workers"].values()]
        yield c
    assert pids and not any(psutil.pid_exists(pid) for pid in pids), "worker left behind"


def run_all(
    client: Client,
    requests: list[float],
    hold: float,
    rendezvous: Path | None = None,
) -> list[Run]:
    """Submit one ``use_gpus`` per request, all at once; their records, in order."""
    futures = [
        client.submit(
            use_gpus,
            tag,
            hold,
            None if rendezvous is None else str(rendezvous),
            len(requests),
            resources={"gpu": gpu},
            pure=False,
        )
        for tag, gpu in enumerate(requests)
    ]
    wait(futures, timeout=30)
    runs = []
    for gpu, (printed, held, start, end, worker, arrived) in zip(
        requests, client.gather(futures), strict=True
    ):
        assert arrived, "tasks that fit together did not all run together"
        cuda, _, pool_variable = printed.partition("|")
        runs.append(Run(gpu, cuda.split(","), pool_variable, held, start, end, worker))
    return runs


def overlap(a: Run, b: Run) -> bool:
    return a.start < b.end and b.start < a.end


def check_each_run(runs: list[Run]) -> None:
    """Every child saw the units its task holds: as many as asked, distinct, from the pool."""
    for run in runs:
        count = max(1, int(run.gpu))  # a fraction holds (part of) one unit
        assert len(run.seen) == len(set(run.seen)) == count, run
        assert set(run.seen) <= LABELS, run
        assert run.pool_variable == ",".join(run.seen), run
        assert run.held == {"gpu": [int(label) for label in run.seen]}, run
        assert run.worker == "gpus", run


def use_per_unit(runs: list[Run]) -> dict[tuple[float, str], Fraction]:
    """How much of each unit is in use at every instant where some task starts.

    The most in use at once is reached at some start; a run ending exactly at
    another's start no longer counts there.
    """
    use: dict[tuple[float, str], Fraction] = {}
    for instant in sorted(run.start for run in runs):
        for run in runs:
            if run.start <= instant < run.end:
                share = min(Fraction(run.gpu), Fraction(1))
                for label in run.seen:
                    use[instant, label] = use.get((instant, label), Fraction(0)) + share
    return use


def peak(runs: list[Run]) -> int:
    return max(sum(1 for r in runs if r.start <= s.start < r.end) for s in runs)


def test_concurrent_single_gpu_tasks_never_share_a_unit(client: Client) -> None:
    runs = run_all(client, [1] * 8, hold=0.2)
    check_each_run(runs)
    assert peak(runs) >= 2, "no two tasks ran together: the test proved nothing"
    for a in runs:
        for b in runs:
            if a is not b and overlap(a, b):
                assert a.seen != b.seen, f"one unit given to two running tasks: {a}, {b}"


def test_a_two_gpu_task_sees_two_distinct_units(client: Client) -> None:
    runs = run_all(client, [2, 2], hold=0.2)
    check_each_run(runs)
    first, second = runs
    if overlap(first, second):
        assert not set(first.seen) & set(second.seen), runs


def test_halves_pack_two_to_a_unit(client: Client, tmp_path: Path) -> None:
    # All four are held at once (the rendezvous sees to it), so each was placed while
    # the earlier ones held theirs: the fullest unit with room is then always a half
    # used one if there is one, and the four halves fill exactly two units.
    runs = run_all(client, [0.5] * 4, hold=0.2, rendezvous=tmp_path)
    check_each_run(runs)
    by_unit: dict[str, int] = {}
    for run in runs:
        by_unit[run.seen[0]] = by_unit.get(run.seen[0], 0) + 1
    assert sorted(by_unit.values()) == [2, 2], runs
    assert max(use_per_unit(runs).values()) == 1


def test_mixed_whole_and_fractional_tasks_never_overcommit_a_unit(client: Client) -> None:
    requests = [1, 0.5, 0.25, 2, 0.5, 0.75, 1, 0.25, 0.5, 1, 0.75, 0.5, 2, 0.25]
    runs = run_all(client, requests, hold=0.15)
    check_each_run(runs)
    assert peak(runs) >= 2, "no two tasks ran together: the test proved nothing"
    over = {key: used for key, used in use_per_unit(runs).items() if used > 1}
    assert not over, describe(over, runs)


def describe(over: Mapping[tuple[float, str], Fraction], runs: list[Run]) -> str:
    lines = [
        f"unit {label} at {instant:.3f}: {float(used)} in use"
        for (instant, label), used in over.items()
    ]
    return "\n".join([*lines, *map(str, runs)])
