"""Command runs through an injected launcher: a real scheduler and worker, no process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from apportion.runs.journal import CANCELLED, COMPLETED, FINISHED, Journal, RunRecord
from apportion.runs.live import LiveRuns
from apportion.runs.service import RunsService
from apportion.runs.spec import new_spec
from apportion.scheduler.service import Scheduler
from apportion.testing import FakeLauncher
from apportion.worker.service import Worker

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
        async with (
            Scheduler(port=0, companions=[RunsService(journal)]) as scheduler,
            Worker(scheduler.address, 1, long_lived=LiveRuns(launcher)),
        ):
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
    assert [launch.argv for launch in launcher.launches] == [("pretend", "to", "run")]
    log = tmp_path / "runs-logs" / f"{record.id}.log"
    assert log.read_bytes() == b"pretend output\n"


def test_a_blocked_fake_command_is_cancelled(tmp_path: Path) -> None:
    record = asyncio.run(_run(tmp_path, FakeLauncher(block=True), cancel=True))
    assert record.state == CANCELLED and record.signal == 15
