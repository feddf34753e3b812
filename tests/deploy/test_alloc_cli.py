"""``apportion alloc slurm``: its options become the job's batch script."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from apportion.net.scheduler_file import write_scheduler_file


@pytest.fixture(autouse=True)
def environment_restored() -> Iterator[None]:
    """A command run in this process takes its scheduler file's secret into the
    environment, as it would in a process of its own: undo it for the next test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_the_dry_run_prints_the_job_the_options_describe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path / "home"))
    file = tmp_path / "scheduler.json"
    write_scheduler_file(file, "tcp://10.0.0.1:8786", "t" * 32, "s")
    result = CliRunner().invoke(
        main,
        [
            *["alloc", "slurm", "--scheduler-file", str(file), "--cores", "4"],
            *["--memory", "8GiB", "--gpus", "1", "--walltime", "30:00"],
            *["--log-directory", str(tmp_path / "logs"), "--dry-run", "--", "--constraint=a100"],
        ],
    )
    assert result.exit_code == 0, result.output
    assert "#SBATCH --gres=gpu:1" in result.output
    assert "#SBATCH --constraint=a100" in result.output
    assert "#SBATCH --time=30:00" in result.output
    assert f"--scheduler-file {file}" in result.output
    assert "t" * 32 not in result.output  # the secret stays in the file


def test_alloc_needs_a_scheduler_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["alloc", "slurm", "--dry-run"], env={"APPORTION_SCHEDULER_FILE": ""}
    )
    assert result.exit_code == 2 and "--scheduler-file" in result.output


def test_a_bad_walltime_is_one_line(tmp_path: Path) -> None:
    file = tmp_path / "scheduler.json"
    write_scheduler_file(file, "tcp://10.0.0.1:8786", "t" * 32, "s")
    result = CliRunner().invoke(
        main, ["alloc", "slurm", "--scheduler-file", str(file), "--walltime", "1h", "--dry-run"]
    )
    assert result.exit_code == 1 and "Slurm's format" in result.output
