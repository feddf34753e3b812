"""Heartbeats against the worker timeout, in-process, and the scheduler's CLI option."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from apportion import Scheduler, Worker
from apportion.cli.main import main
from apportion.scheduler.state import SchedulerConfig


@pytest.mark.timeout(20)
def test_heartbeats_keep_an_idle_worker_registered_past_the_timeout() -> None:
    config = SchedulerConfig(worker_timeout=0.6)
    with (
        Scheduler(port=0, config=config) as scheduler,
        Worker(scheduler.address, nthreads=1, heartbeat_interval=0.1) as worker,
    ):
        deadline = time.monotonic() + 10
        while not scheduler.info()["workers"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(2.0)  # measuring silence: several timeouts pass with only heartbeats
        assert list(scheduler.info()["workers"]) == [worker.address]
        assert worker.sessions == 1


@pytest.mark.timeout(10)
def test_scheduler_cli_passes_the_worker_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SchedulerConfig] = []

    async def fake_run(
        host: str, port: int, config: SchedulerConfig, *args: object, **kw: object
    ) -> None:
        seen.append(config)

    monkeypatch.setattr("apportion.cli.scheduler._run", fake_run)
    assert CliRunner().invoke(main, ["scheduler", "--worker-timeout", "2.5"]).exit_code == 0
    assert CliRunner().invoke(main, ["scheduler"]).exit_code == 0
    assert [c.worker_timeout for c in seen] == [2.5, 30.0]
    result = CliRunner().invoke(main, ["scheduler", "--help"])
    assert "--worker-timeout" in result.output
    assert CliRunner().invoke(main, ["scheduler", "--worker-timeout", "0"]).exit_code == 2
