"""What ``apportion slurm`` would start: pure decisions, no Slurm, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.deploy.slurm_env import NotInAllocation
from apportion.deploy.slurm_plan import (
    LaunchOptions,
    SlurmJob,
    default_scheduler_file,
    missing_text,
    missing_workers,
    scheduler_host,
    slurm_job,
    step_to_signal,
    worker_step,
    worker_step_name,
)

ONE = SlurmJob("7", 1, "vm")
FOUR = SlurmJob("8", 4, "node[1-4]")


def test_the_allocation_is_read_from_the_environment() -> None:
    env = {"SLURM_JOB_ID": "8", "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "node[1-4]"}
    assert slurm_job(env) == FOUR
    with pytest.raises(NotInAllocation, match="from an sbatch script or an salloc shell"):
        slurm_job({})
    with pytest.raises(ValueError, match="SLURM_JOB_NUM_NODES='0'"):
        slurm_job({**env, "SLURM_JOB_NUM_NODES": "0"})


def test_one_node_listens_on_loopback_several_on_the_node_address() -> None:
    assert scheduler_host(ONE, "10.0.0.5") == "127.0.0.1"
    assert scheduler_host(FOUR, "10.0.0.5") == "10.0.0.5"


def test_the_scheduler_file_is_named_for_the_job() -> None:
    assert default_scheduler_file(ONE, Path("/home/u/run")) == Path(
        "/home/u/run/apportion-scheduler-7.json"
    )


def test_one_srun_step_starts_a_supervisor_per_node_sharing_the_allocation() -> None:
    options = LaunchOptions(nworkers_per_node=2, nthreads=3, resources="licence=1")
    argv = worker_step(["/py"], FOUR, options, Path("/s.json"))
    srun = argv[: argv.index("sh")]
    assert srun == [
        "srun",
        "--nodes=4",
        "--ntasks=4",
        "--ntasks-per-node=1",
        "--overlap",
        "--job-name=apportion-workers-8",
    ]
    worker = argv[argv.index("/py") :]
    assert worker[:4] == ["/py", "-m", "apportion.cli.main", "worker"]
    flags = dict(zip(worker[4::2], worker[5::2], strict=True))
    assert flags == {
        "--scheduler-file": "/s.json",
        "--nworkers": "2",
        "--resources": "slurm licence=1",
        "--drain-timeout": "10.0",
        "--nthreads": "3",
    }
    # Named after the node; on several nodes, serving data on the node's address.
    wrapper = argv[argv.index("-c") + 1]
    assert '--name "$SLURMD_NODENAME"' in wrapper and "--host" in wrapper


def test_on_one_node_workers_keep_loopback_and_threads_follow_the_grant() -> None:
    argv = worker_step(["/py"], ONE, LaunchOptions(), Path("/s.json"))
    assert "--host" not in argv[argv.index("-c") + 1]
    assert "--nthreads" not in argv
    assert argv[argv.index("--resources") + 1] == "slurm"


def test_missing_workers_are_counted_by_node() -> None:
    nodes = ["node1", "node10", "node2"]
    names = ["node1-0", "node1-1", "node10-0", "stranger", "node2x-0"]
    assert missing_workers(nodes, 2, names) == {"node10": 1, "node2": 0}
    assert missing_workers(["vm"], 1, ["vm"]) == {}
    text = missing_text({"node10": 1, "node2": 0}, 2, 120)
    assert text == (
        "workers did not register within 120s on 2 node(s): node10 (1 of 2), node2 (0 of 2); "
        "see the worker step's output above"
    )


def test_the_workers_step_is_found_by_its_name_to_be_drained() -> None:
    listed = "8.batch batch\n8.0 apportion-workers-8\n8.1 python\n"
    assert step_to_signal(listed, FOUR) == "8.0"
    assert step_to_signal("8.batch batch\n", FOUR) is None
    assert worker_step_name(FOUR) == "apportion-workers-8"
