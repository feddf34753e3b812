"""apportion on a real (one-node) Slurm: the batch scripts the docs show, run by sbatch.

The cluster is started once for the module (``slurm_cluster``), with four fake GPUs
as GRES, and skipped with the reason where it cannot run (not root, Slurm not
installed). Jobs run this checkout of apportion: the job's environment puts this
Python first on PATH and this source tree on PYTHONPATH, as a user's installation
would be found. Each script below is the text ``docs/deploy.md`` shows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import dask.array as da
import psutil
import pytest

import apportion
from cli_processes import Processes, poll
from slurm_cluster import SlurmCluster, missing

pytestmark = pytest.mark.process

#: The batch script of ``apportion slurm``: a cluster for the length of one command.
SLURM_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=apportion-example
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --mem=2G
#SBATCH --gres=gpu:2
#SBATCH --time=00:10:00
#SBATCH --output=apportion-%j.out

# One scheduler on this node, one worker supervisor per node of the job offering
# what Slurm granted it (--resources slurm); script.py's Client() connects to them.
apportion slurm --nworkers-per-node 1 -- python script.py
"""

#: The user's script: unchanged from a laptop, where ``Client()`` starts a local cluster.
USER_SCRIPT = """\
import json
import os

from apportion import Client, task_environment


def gpu_task():
    # The GPUs this task holds, as a program it starts would see them.
    return task_environment()["CUDA_VISIBLE_DEVICES"]


with Client() as client:
    client.wait_for_workers(1, timeout=60)
    total = client.submit(sum, [1, 2, 3]).result()
    mask = client.submit(gpu_task, resources={"gpu": 1}, pure=False).result()
    print(json.dumps({
        "job": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "task": mask,
        "sum": total,
        "scheduler_file": os.environ.get("APPORTION_SCHEDULER_FILE"),
    }))
"""

#: The manual way: the scheduler and ``srun apportion worker`` in one batch script.
MANUAL_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=apportion-manual
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --mem=2G
#SBATCH --gres=gpu:2
#SBATCH --output=apportion-%j.out

export APPORTION_SCHEDULER_FILE="$PWD/apportion-scheduler-$SLURM_JOB_ID.json"
apportion scheduler --scheduler-file "$APPORTION_SCHEDULER_FILE" &
scheduler=$!
# One worker supervisor per node, started at once: each waits for the scheduler file
# (up to --connect-timeout); --overlap leaves the allocation to other steps too.
srun --overlap --ntasks-per-node=1 \\
    apportion worker --scheduler-file "$APPORTION_SCHEDULER_FILE" --resources slurm &
workers=$!
python script.py
status=$?
kill -TERM "$workers"; wait "$workers"
kill -TERM "$scheduler"; wait "$scheduler"
exit $status
"""

#: A job that runs until cancelled.
SLEEP_SCRIPT = """\
#!/bin/bash
#SBATCH --nodes=1
#SBATCH --mem=1G
#SBATCH --output=apportion-%j.out
apportion slurm -- sleep 600
"""


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """A one-node Slurm cluster for every test here, stopped (and checked empty) after."""
    reason = missing()
    if reason is not None:
        pytest.skip(f"no Slurm cluster here: {reason}")
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def job_env(tmp_path: Path) -> dict[str, str]:
    """What a job needs to run this checkout: its Python first on PATH, its source."""
    source = str(Path(apportion.__file__).resolve().parent.parent)
    home = tmp_path / "home"
    home.mkdir()
    return {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": source,
        "APPORTION_HOME": str(home),
    }


def apportion_processes(job: str) -> list[psutil.Process]:
    """Live processes of job ``job`` that run apportion (its CLI or a worker)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (proc.info["environ"] or {}).get("SLURM_JOB_ID") != job:
                continue
            runs_apportion = any("apportion" in part for part in proc.info["cmdline"] or [])
            if runs_apportion and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def submit(slurm: SlurmCluster, tmp_path: Path, script: str, env: dict[str, str]) -> str:
    (tmp_path / "script.py").write_text(USER_SCRIPT)
    batch = tmp_path / "job.sh"
    batch.write_text(script)
    return slurm.sbatch(batch, cwd=tmp_path, env=env)


def finished_output(slurm: SlurmCluster, tmp_path: Path, job: str) -> tuple[str, str]:
    state = slurm.wait_finished(job, timeout=100)
    return state, (tmp_path / f"apportion-{job}.out").read_text()


def result_of(output: str) -> dict[str, object]:
    """What the user's script printed, having checked its GPU task saw one device of the
    two Slurm granted the job (Slurm's own mask for --gres=gpu:2)."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert len(lines) == 1, output
    found: dict[str, object] = json.loads(lines[0])
    granted = str(found["job"]).split(",")
    assert len(granted) == 2, output
    assert str(found["task"]).split(",") in [[g] for g in granted], output
    return found


@pytest.mark.timeout(150)
def test_a_batch_script_runs_the_users_script_on_the_granted_gpus(
    slurm: SlurmCluster, tmp_path: Path, job_env: dict[str, str]
) -> None:
    job = submit(slurm, tmp_path, SLURM_SCRIPT, job_env)
    state, output = finished_output(slurm, tmp_path, job)
    assert state == "COMPLETED", output
    found = result_of(output)
    assert found["sum"] == 6
    # Once the script ended the workers drained and left, rather than being killed.
    assert re.search(r"worker \S+ drained", output), output
    assert found["scheduler_file"] == str(tmp_path / f"apportion-scheduler-{job}.json")
    assert not Path(str(found["scheduler_file"])).exists()  # removed at the end
    assert not apportion_processes(job)


@pytest.mark.timeout(150)
def test_the_manual_batch_script_with_srun_apportion_worker(
    slurm: SlurmCluster, tmp_path: Path, job_env: dict[str, str]
) -> None:
    job = submit(slurm, tmp_path, MANUAL_SCRIPT, job_env)
    state, output = finished_output(slurm, tmp_path, job)
    assert state == "COMPLETED", output
    result_of(output)
    assert not apportion_processes(job)


@pytest.mark.timeout(150)
def test_scancel_leaves_no_apportion_process(
    slurm: SlurmCluster, tmp_path: Path, job_env: dict[str, str]
) -> None:
    job = submit(slurm, tmp_path, SLEEP_SCRIPT, job_env)
    log = tmp_path / f"apportion-{job}.out"
    poll(
        lambda: log.exists() and "running sleep 600" in log.read_text(),
        60,
        f"job {job} to run its command:\n{log.read_text() if log.exists() else ''}",
    )
    before = apportion_processes(job)
    assert len(before) >= 3  # apportion slurm, the scheduler, a worker
    slurm.run("scancel", job)
    poll(lambda: not apportion_processes(job), 40, "the job's apportion processes to end")
    slurm.wait_finished(job, timeout=40)
    output = log.read_text()
    # scancel signals every process of the job at once: apportion slurm hears either
    # its own SIGTERM or, first, its COMMAND ending; either way it stops the cluster.
    assert "stopping the scheduler" in output, output


# --- a cluster that grows through sbatch ------------------------------------------------


def _gpus_seen() -> str:
    return apportion.task_environment().get("CUDA_VISIBLE_DEVICES", "")


def _jobs(cluster: apportion.SlurmCluster) -> dict[str, dict[str, object]]:
    jobs: dict[str, dict[str, object]] = cluster.status()["jobs"]  # type: ignore[assignment]
    return jobs


@pytest.mark.timeout(180)
def test_an_adaptive_cluster_asks_for_a_gpu_job_only_for_gpu_work_and_cancels_it_idle(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setenv("SLURM_CONF", slurm.env()["SLURM_CONF"])
    gpu = apportion.JobTemplate(name="gpu", cores=1, memory="1GiB", gpus=1, walltime="10:00")
    with apportion.SlurmCluster(
        cores=1,
        memory="1GiB",
        name="cpu",
        walltime="10:00",
        templates=[gpu],
        log_directory=tmp_path / "jobs",
        host="127.0.0.1",
        interval=0.3,
    ) as cluster:
        assert "#SBATCH --gres=gpu:1" in cluster.job_script("gpu")
        cluster.adapt(minimum=0, maximum=2, idle_timeout=2)
        time.sleep(1.5)
        assert _jobs(cluster) == {}  # no work, no job
        with apportion.Client(cluster) as client:
            seen = client.submit(_gpus_seen, resources={"gpu": 1}).result(timeout=90)
            jobs = _jobs(cluster)
            # The GPU task brought one GPU job and nothing else.
            assert [job["shape"] for job in jobs.values()] == ["gpu"], jobs
            (job,) = jobs
            assert seen.isdigit(), seen  # one of the GRES devices Slurm granted the job
            # Work no job shape can hold is reported, and brings no job.
            too_big = client.submit(_gpus_seen, resources={"gpu": 4})
            poll(lambda: any("gpu=4" in r for r in cluster.reports), 20, "the report")
            assert set(_jobs(cluster)) <= {job}
            too_big.cancel()
            # Idle past the timeout: the job is cancelled and its worker leaves.
            poll(lambda: not _jobs(cluster), 60, "the idle job cancelled")
            poll(lambda: not client.scheduler_info()["workers"], 60, "its worker gone")
            assert slurm.state(job) in ("CANCELLED", "COMPLETED", ""), slurm.state(job)


@pytest.mark.timeout(180)
def test_apportion_alloc_slurm_grows_a_running_cluster_and_cancels_its_jobs_on_exit(
    slurm: SlurmCluster, tmp_path: Path, procs: Processes, job_env: dict[str, str]
) -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    file = tmp_path / "scheduler.json"
    env = slurm.env(job_env)
    procs.start_scheduler("--port", "0", "--no-journal", "--scheduler-file", str(file), env=env)
    alloc, log = procs.start(
        *["alloc", "slurm", "--scheduler-file", str(file), "--cores", "1"],
        *["--memory", "1GiB", "--walltime", "10:00", "--interval", "0.3"],
        *["--idle-timeout", "600", "--log-directory", str(tmp_path / "jobs")],
        env=env,
    )
    with apportion.Client(scheduler_file=file, timeout=20) as client:
        assert client.submit(sum, [1, 2, 3]).result(timeout=90) == 6
        # Dask's own collections run there too, through .compute() and client.compute.
        total = da.ones(100, chunks=10).sum()
        assert total.compute() == 100
        assert client.compute(total).result(timeout=60) == 100
        (worker,) = client.scheduler_info()["workers"].values()
        job = str(worker["name"]).removeprefix("slurm-")
        assert slurm.state(job) == "RUNNING"
        alloc.send_signal(signal.SIGINT)  # leaving: the jobs it submitted are cancelled
        assert alloc.wait(30) == 0, log.read_text()
        poll(lambda: not client.scheduler_info()["workers"], 60, "the job's worker gone")
    poll(lambda: slurm.state(job) in ("CANCELLED", "COMPLETED", ""), 30, "the job ended")
