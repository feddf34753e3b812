"""Command runs through an injected launcher: the real scheduler, job queue and worker
on the in-memory cluster, no process and no socket; and a worker built without one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from apportion.runs import remote
from apportion.runs.journal import CANCELLED, COMPLETED, FAILED, FINISHED, Journal, RunRecord
from apportion.runs.live import LiveRuns
from apportion.runs.service import RunsService
from apportion.runs.spec import new_spec
from apportion.testing import FakeLauncher, InMemoryCluster

pytestmark = pytest.mark.timeout(30)


async def _finished(reader: Journal, run_id: int) -> RunRecord:
    while True:
        record = reader.get(run_id)
        assert record is not None
        if record.state in FINISHED:
            return record
        await asyncio.sleep(0.02)


async def _run(tmp_path: Path, launcher: FakeLauncher, *, cancel: bool) -> RunRecord:
    journal = Journal(tmp_path / "runs.db")
    reader = Journal(tmp_path / "runs.db")
    try:
        worker = {"name": "runner", "long_lived": LiveRuns(launcher)}
        async with InMemoryCluster([worker], companions=[RunsService(journal)]) as cluster:
            assert cluster.address.startswith("inproc://")
            (run_id,) = reader.stage([new_spec(["pretend", "to", "run"])], time.time())
            if cancel:
                while not launcher.launches:
                    await asyncio.sleep(0.02)
                reader.request_cancel(run_id, time.time())
            return await asyncio.wait_for(_finished(reader, run_id), 20)
    finally:
        reader.close()
        journal.close()


def test_a_run_goes_through_the_injected_launcher(tmp_path: Path) -> None:
    launcher = FakeLauncher(output=b"pretend output\n")
    record = asyncio.run(_run(tmp_path, launcher, cancel=False))
    assert record.state == COMPLETED and record.exit_code == 0
    assert record.worker == "runner" and record.attempts == 1
    assert [launch.argv for launch in launcher.launches] == [("pretend", "to", "run")]
    log = tmp_path / "runs-logs" / f"{record.id}.log"
    assert log.read_bytes() == b"pretend output\n"


def test_a_blocked_fake_command_is_cancelled(tmp_path: Path) -> None:
    launcher = FakeLauncher(block=True)
    record = asyncio.run(_run(tmp_path, launcher, cancel=True))
    assert record.state == CANCELLED and record.signal == 15
    assert [launch.argv for launch in launcher.launches] == [("pretend", "to", "run")]


def test_a_worker_built_without_a_launcher_fails_runs_saying_why(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "runs.db")
    reader = Journal(tmp_path / "runs.db")
    try:
        with InMemoryCluster(1, companions=[RunsService(journal)]) as cluster:
            (run_id,) = remote.submit(cluster.address, [new_spec(["never", "started"])]).ids
            record = cluster.run(asyncio.wait_for(_finished(reader, run_id), 20))
    finally:
        reader.close()
        journal.close()
    assert record.state == FAILED, record
    assert "built without a launcher" in record.reason, record.reason
