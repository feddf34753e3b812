"""Worker jobs for Slurm: the batch script and the shape the allocator plans with."""

from __future__ import annotations

import pytest

from apportion.core.resources import SCALE
from apportion.deploy.allocator import ENDED, QUEUED, RUNNING, JobState
from apportion.deploy.job_template import (
    JobTemplate,
    parse_job_id,
    parse_states,
    walltime_seconds,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30", 1800),
        ("30:15", 1815),
        ("01:00:00", 3600),
        ("1-00", 86_400),
        ("1-02:30", 95_400),
        ("2-00:00:10", 172_810),
    ],
)
def test_walltimes_in_slurm_formats(text: str, expected: int) -> None:
    assert walltime_seconds(text) == expected


def test_a_bad_walltime_says_what_is_expected() -> None:
    with pytest.raises(ValueError, match="Slurm's format"):
        JobTemplate(walltime="1h")


def test_the_script_asks_for_the_shape_and_runs_the_worker() -> None:
    template = JobTemplate(
        name="gpu",
        cores=4,
        memory="16GiB",
        gpus=2,
        resources="licence=1",
        walltime="02:00:00",
        queue="gpu",
        account="lab",
        job_extra_directives=["--constraint=a100"],
        job_script_prologue=["module load cuda"],
        python="/opt/py/bin/python",
        log_directory="/shared/logs",
    )
    script = template.script("/shared/s.json", {"APPORTION_TLS_CA": "/shared/ca.pem"})
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    for directive in (
        "--cpus-per-task=4",
        "--mem=16384M",
        "--gres=gpu:2",
        "--time=02:00:00",
        "--partition=gpu",
        "--account=lab",
        "--constraint=a100",
        "--output=/shared/logs/%x-%j.out",
    ):
        assert f"#SBATCH {directive}" in lines
    assert "module load cuda" in lines
    assert "export APPORTION_TLS_CA=/shared/ca.pem" in lines
    last = lines[-1]
    assert last.startswith("exec /opt/py/bin/python -m apportion.cli.main worker")
    assert "--scheduler-file /shared/s.json" in last
    assert "--name slurm-${SLURM_JOB_ID}" in last  # expanded by the job's shell
    assert "--resources 'slurm licence=1'" in last
    assert "--lifetime 7140" in last  # drains a minute before the walltime


def test_the_shape_is_what_each_worker_process_offers() -> None:
    shape = JobTemplate(cores=4, memory="8GiB", processes=2, gpus=2, resources="licence=1").shape()
    assert shape.processes == 2 and shape.nthreads == 2
    assert shape.supply == {
        "cpus": 2 * SCALE,
        "memory": 4 * 2**30 * SCALE,
        "gpu": SCALE,
        "licence": SCALE,
    }
    assert shape.indexed == {"gpu"}
    assert shape.fits({"gpu": SCALE}) and not shape.fits({"gpu": 2 * SCALE})


def test_templates_that_cannot_be_are_refused() -> None:
    with pytest.raises(ValueError, match="do not split"):
        JobTemplate(cores=3, processes=2)
    with pytest.raises(ValueError):
        JobTemplate(resources="licence=")


def test_what_slurm_prints_is_read() -> None:
    assert parse_job_id("1234\n") == "1234"
    assert parse_job_id("1234;cluster\n") == "1234"
    with pytest.raises(ValueError, match="no job id"):
        parse_job_id("sbatch: error: Batch job submission failed")
    assert parse_states("12 PENDING\n13 RUNNING\n14 FAILED\n\n") == {
        "12": JobState(QUEUED, "PENDING"),
        "13": JobState(RUNNING, "RUNNING"),
        "14": JobState(ENDED, "FAILED"),
    }
