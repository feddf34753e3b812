"""Guild's queue order on the in-memory cluster: the job queue as the scheduler's
companion, commands run by a launcher the test steps through. No process, no socket.

The same scenarios as the CLI's (``test_runs_queue.py``) and the task-level Guild
example (``test_guild_scenario.py``): FIFO with backfill on one worker with
``gpu0=1 gpu1=1``, devices handed to the runs that hold them, and runs the cluster
can never meet reported rather than left waiting. Order is asserted from what was
running at each start, recorded by the launcher, so no timing decides the outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from apportion.core.resources import parse_supply
from apportion.runs import remote
from apportion.runs.journal import COMPLETED, FAILED, STAGED, Journal
from apportion.runs.launcher import Launch
from apportion.runs.live import LiveRuns
from apportion.runs.process import ExitStatus, RunOutcome
from apportion.runs.queue import QueueOptions
from apportion.runs.service import RunsService
from apportion.runs.spec import new_spec
from apportion.testing import InMemoryCluster

pytestmark = pytest.mark.timeout(30)

#: Seconds to wait for the queue to reach an expected state (never needed in full).
PATIENCE = 10.0

GUILD_GPU = {"aaa": "gpu0=1", "bbb": "gpu0=1", "ccc": "gpu0=1 gpu1=1", "ddd": "gpu1=1"}


class SteppedLauncher:
    """Runs nothing: each command "runs" until the test ``finish``es it by name (its
    argv[0]), and every start records which commands were running at that moment."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running: dict[str, threading.Event] = {}
        #: (name, names running beside it, the launch) for every start, in order.
        self.starts: list[tuple[str, frozenset[str], Launch]] = []

    def run(
        self,
        launch: Launch,
        *,
        on_start: Callable[[int], None],
        on_output: Callable[[bytes], None],
        cancel: threading.Event,
    ) -> RunOutcome:
        """See ``apportion.runs.launcher.Launcher.run``."""
        name = launch.argv[0]
        finish = threading.Event()
        with self._changed:
            self.starts.append((name, frozenset(self._running), launch))
            self._running[name] = finish
            self._changed.notify_all()
        on_start(100_000 + len(self.starts))
        while not finish.wait(0.01) and not cancel.is_set():
            pass
        with self._changed:
            del self._running[name]
            self._changed.notify_all()
        if not finish.is_set():
            return RunOutcome(ExitStatus(None, 15), "cancelled", "stopped with SIGTERM", 0)
        return RunOutcome(ExitStatus(0, None), "completed", "exit code 0", 0)

    def wait_running(self, *names: str) -> None:
        """Wait until exactly ``names`` are running."""
        with self._changed:
            if not self._changed.wait_for(lambda: set(self._running) == set(names), PATIENCE):
                raise AssertionError(f"running {sorted(self._running)}, expected {sorted(names)}")

    def finish(self, name: str) -> None:
        """End the running command ``name`` with exit status 0."""
        with self._changed:
            self._running[name].set()


@contextmanager
def queue_cluster(
    tmp_path: Path, supply: str, launcher: SteppedLauncher
) -> Iterator[tuple[InMemoryCluster, Journal]]:
    """One worker with ``supply``, the job queue beside its scheduler as ``apportion
    scheduler --run-once`` has it (a fixed cluster), and a reader of the journal."""
    amounts, _ = parse_supply(supply)
    journal = Journal(tmp_path / "runs.db")
    reader = Journal(tmp_path / "runs.db")
    runs = RunsService(journal, QueueOptions(adopt_grace=0.0, fixed_supply=amounts))
    worker = {"name": "gpus", "nthreads": 4, "resources": supply, "long_lived": LiveRuns(launcher)}
    try:
        with InMemoryCluster([worker], companions=[runs]) as cluster:
            yield cluster, reader
    finally:
        reader.close()
        journal.close()


def wait_for(done: Callable[[], bool], what: str) -> None:
    """Poll the journal (another thread writes it; nothing signals this test)."""
    deadline = time.monotonic() + PATIENCE
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def states(journal: Journal) -> dict[int, str]:
    return {record.id: record.state for record in journal.runs()}


@pytest.mark.parametrize("order", [["aaa", "bbb", "ccc", "ddd"], ["aaa", "ddd", "bbb", "ccc"]])
def test_guild_gpu_runs_go_first_in_first_out_with_backfill(
    tmp_path: Path, order: list[str]
) -> None:
    launcher = SteppedLauncher()
    with queue_cluster(tmp_path, "gpu0=1 gpu1=1", launcher) as (cluster, journal):
        specs = [new_spec([name], resources=GUILD_GPU[name], name=name) for name in order]
        ids = dict(zip(order, remote.submit(cluster.address, specs).ids, strict=True))
        launcher.wait_running("aaa", "ddd")  # ddd backfills beside aaa, whatever its place
        launcher.finish("aaa")
        launcher.wait_running("bbb", "ddd")  # bbb is next in line for gpu0
        launcher.finish("ddd")
        launcher.wait_running("bbb")  # ccc waits for gpu0 too
        launcher.finish("bbb")
        launcher.wait_running("ccc")
        launcher.finish("ccc")
        wait_for(lambda: set(states(journal).values()) == {COMPLETED}, "every run to complete")
    beside = [(name, running) for name, running, _ in launcher.starts]
    # aaa and ddd start in the same pass: which thread comes first is not the queue's.
    assert {name for name, _ in beside[:2]} == {"aaa", "ddd"}
    assert beside[2:] == [("bbb", frozenset({"ddd"})), ("ccc", frozenset())]
    assert sorted(ids) == sorted(GUILD_GPU)


def test_runs_see_the_devices_they_hold(tmp_path: Path) -> None:
    launcher = SteppedLauncher()
    with queue_cluster(tmp_path, "gpu=[0,1]", launcher) as (cluster, journal):
        specs = [new_spec(["one-a"], resources="gpu=1"), new_spec(["one-b"], resources="gpu=1")]
        specs.append(new_spec(["both"], resources="gpu=2"))
        remote.submit(cluster.address, specs)
        launcher.wait_running("one-a", "one-b")
        launcher.finish("one-a")
        launcher.finish("one-b")
        launcher.wait_running("both")
        launcher.finish("both")
        wait_for(lambda: set(states(journal).values()) == {COMPLETED}, "every run to complete")
    devices = {name: launch.env["CUDA_VISIBLE_DEVICES"] for name, _, launch in launcher.starts}
    assert devices["both"] == "0,1"
    assert {devices["one-a"], devices["one-b"]} == {"0", "1"}, "two runs on one GPU at once"


def test_runs_the_cluster_can_never_meet_are_reported_not_left_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="apportion.runs")
    launcher = SteppedLauncher()
    staging = Journal(tmp_path / "runs.db")
    try:
        # Staged before the scheduler starts, as ``apportion stage`` then ``--run-once``.
        undefined, plain = staging.stage(
            [new_spec(["needs-foo"], resources="foo=1"), new_spec(["plain"])], time.time()
        )
    finally:
        staging.close()
    with queue_cluster(tmp_path, "gpu0=1", launcher) as (cluster, journal):
        launcher.wait_running("plain")
        launcher.finish("plain")
        (too_big,) = remote.submit(cluster.address, [new_spec(["too-big"], resources="gpu0=2")]).ids
        wait_for(lambda: states(journal).get(too_big) == FAILED, "the oversized run to fail")
        wait_for(lambda: states(journal)[plain] == COMPLETED, "the plain run to complete")
        assert states(journal)[undefined] == STAGED
        failed = journal.get(too_big)
        assert failed is not None and "gpu0" in failed.reason + failed.waiting
    message = (
        f"ignoring staged run {undefined} "
        "(requires resources not defined for the cluster: foo); it stays staged"
    )
    assert [r.getMessage() for r in caplog.records].count(message) == 1
    assert [name for name, _, _ in launcher.starts] == ["plain"]
