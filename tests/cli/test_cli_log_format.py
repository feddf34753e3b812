"""``--log-format``: offered by every long-running command, checked, and inherited."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from cli_processes import Processes, poll

COMMANDS = [["scheduler"], ["worker"], ["ssh"], ["slurm"], ["alloc", "slurm"]]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_long_running_command_offers_the_option(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0
    assert "--log-format [text|json]" in result.output
    assert "APPORTION_LOG_FORMAT" in result.output


@pytest.mark.timeout(10)
def test_a_bad_format_is_refused_by_name() -> None:
    result = CliRunner().invoke(main, ["scheduler", "--log-format", "xml"])
    assert result.exit_code == 2
    assert "Invalid value for '--log-format'" in result.output
    assert "'xml' is not one of 'text', 'json'" in result.output


@pytest.mark.timeout(10)
def test_a_bad_format_in_the_environment_is_refused_too() -> None:
    result = CliRunner().invoke(main, ["worker"], env={"APPORTION_LOG_FORMAT": "yaml"})
    assert result.exit_code == 2
    assert "'yaml' is not one of 'text', 'json'" in result.output


def _records(log: Path) -> list[dict[str, Any]]:
    """Every line of ``log`` as a JSON object (fails on a line that is not one)."""
    lines = log.read_text().splitlines()
    # The last line may be still being written: only complete lines count.
    complete = lines if log.read_text().endswith("\n") else lines[:-1]
    return [json.loads(line) for line in complete if line.strip()]


@pytest.mark.process
@pytest.mark.tcp
@pytest.mark.timeout(30)
def test_scheduler_supervisor_and_workers_write_json_lines(procs: Processes) -> None:
    env = {k: v for k, v in os.environ.items() if k != "APPORTION_LOG_FORMAT"}
    _, address, scheduler_log = procs.start_scheduler(
        "--port", "0", "--no-journal", "--log-format", "json", env=env
    )
    scheduler_records = _records(scheduler_log)
    assert any(r["message"].startswith("scheduler listening at") for r in scheduler_records)
    assert {r["role"] for r in scheduler_records} == {"scheduler"}

    # The supervisor is given the option; its two worker processes inherit it.
    _, worker_log = procs.start(
        "worker", address, "--log-format", "json", "--nworkers", "2", "--nthreads", "1", env=env
    )

    def both_workers_started() -> bool:
        started = {
            r["pid"]
            for r in _records(worker_log)
            if r["role"] == "worker" and "data at" in r["message"]
        }
        return len(started) == 2

    poll(both_workers_started, 20, "two worker processes to start")
    records = _records(worker_log)
    assert {r["role"] for r in records} == {"supervisor", "worker"}
    for record in records:
        assert {"time", "level", "logger", "message", "role", "pid"} <= record.keys()
