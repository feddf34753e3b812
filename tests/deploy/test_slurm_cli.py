"""``apportion slurm``: what it refuses before starting anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from apportion.cli.main import main

pytestmark = pytest.mark.timeout(10)


def test_outside_an_allocation_it_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = CliRunner().invoke(main, ["slurm", "--", "python", "script.py"])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "Error: not inside a Slurm allocation (SLURM_JOB_ID is not set): run "
        "`apportion slurm` from an sbatch script or an salloc shell"
    ]


def test_malformed_extra_resources_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    result = CliRunner().invoke(main, ["slurm", "--resources", "licence", "--", "true"])
    assert result.exit_code == 2 and result.output.startswith("Error: --resources:")


def test_help_names_the_options() -> None:
    result = CliRunner().invoke(main, ["slurm", "--help"])
    for option in ("--nworkers-per-node", "--nthreads", "--resources", "--scheduler-file"):
        assert option in result.output
