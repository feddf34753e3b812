"""apportion on a real one-node Son of Grid Engine: the batch script the docs show, and a
cluster that grows through qsub (``SGECluster``, ``apportion alloc sge``).

The cell is started once for the module (``sge_cluster``), with a ``gpu`` consumable
of two and a queue whose starter method names the granted GPUs in
``CUDA_VISIBLE_DEVICES`` (as a site's does), and skipped with the reason where it
cannot run (not root, the packages absent). Grid Engine runs no job of root's, so
every job comes from an ordinary user made for the test, whose processes all end
with it. Each job runs this checkout: ``-V`` passes on the submitter's environment,
which has ``apportion`` and ``python`` first on PATH and this source on PYTHONPATH.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_processes import poll
from sge_cluster import GridEngine, environment, missing
from unix_users import UnixUser, skip_reason, unix_users

pytestmark = pytest.mark.process

#: The batch script of ``docs/sge.md``: a cluster for the length of one command.
SGE_SCRIPT = """\
#!/bin/sh
#$ -N apportion-example
#$ -S /bin/sh
#$ -cwd
#$ -j y
#$ -o apportion-$JOB_ID.out
#$ -pe smp 2
#$ -l gpu=1,h_vmem=2G,h_rt=00:10:00
#$ -notify
#$ -V

# One scheduler and one worker supervisor on this host, offering what Grid Engine
# granted the job (--resources sge); script.py's Client() connects to them. exec:
# qdel's warning (-notify) reaches apportion sge, which stops everything in order.
exec apportion sge -- python script.py
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
    (worker,) = client.scheduler_info()["workers"].values()
    print(json.dumps({
        "job": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "task": mask,
        "sum": total,
        "resources": worker["resources"],
        "scheduler_file": os.environ.get("APPORTION_SCHEDULER_FILE"),
    }))
"""

#: ``SGECluster`` as a user would run it on a login node: a GPU job only for GPU work,
#: deleted once idle (its worker drains on qdel's warning).
CLUSTER_SCRIPT = """\
import json
import os
import sys
import time

from apportion import Client, SGECluster, SGEJobTemplate, task_environment


def gpu_task():
    return task_environment()["CUDA_VISIBLE_DEVICES"]


def wait(condition, what):
    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}: {cluster.status()}")
        time.sleep(0.1)


# Grid Engine passes a job none of the submitter's environment: each template says
# what its job needs (here, where this checkout is).
environment = {"PYTHONPATH": os.environ["PYTHONPATH"]}
gpu = SGEJobTemplate(
    name="gpu", gpus=1, walltime="10:00", python=sys.executable, environment=environment
)
with SGECluster(
    name="cpu", walltime="10:00", templates=[gpu], queue="apportion.q",
    python=sys.executable, environment=environment, log_directory="jobs",
    host="127.0.0.1", interval=0.3,
) as cluster:
    cluster.adapt(minimum=0, maximum=2, idle_timeout=1)
    with Client(cluster) as client:
        mask = client.submit(gpu_task, resources={"gpu": 1}).result(timeout=90)
        shapes = [job["shape"] for job in cluster.status()["jobs"].values()]
        (worker,) = client.scheduler_info()["workers"].values()
        wait(lambda: not cluster.status()["jobs"], "the idle job deleted")
        wait(lambda: not client.scheduler_info()["workers"], "its worker gone")
        print(json.dumps({
            "mask": mask, "shapes": shapes, "worker": worker["name"],
            "resources": worker["resources"], "reports": cluster.reports,
        }))
"""


def test_the_docs_show_these_scripts() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "sge.md").read_text()
    assert f"```bash\n{SGE_SCRIPT}```" in page
    assert f"```python\n{USER_SCRIPT}```" in page


@pytest.fixture(scope="module")
def grid_engine() -> Iterator[GridEngine]:
    """The one-node cell for every test here; its daemons stopped after."""
    reason = missing() or skip_reason()
    if reason is not None:
        pytest.skip(f"no Grid Engine here: {reason}")
    cell = GridEngine()
    try:
        cell.start()
        yield cell
    finally:
        cell.stop()


@pytest.fixture
def user(grid_engine: GridEngine) -> Iterator[UnixUser]:
    """An ordinary user whose environment runs this checkout's ``apportion`` and
    ``python`` and reaches the cell."""
    with unix_users(1) as (person,):
        bin_dir = person.home / "bin"
        bin_dir.mkdir()
        python = " ".join(person.python)
        for name, body in (("apportion", f"{python} -m apportion.cli.main"), ("python", python)):
            (bin_dir / name).write_text(f'#!/bin/sh\nexec {body} "$@"\n')
            (bin_dir / name).chmod(0o755)
        subprocess.run(["chown", "-R", person.name, str(bin_dir)], check=True, timeout=10)
        sge = environment()
        person.env.update(
            PATH=f"{bin_dir}:{person.env['PATH']}",
            SGE_ROOT=sge["SGE_ROOT"],
            SGE_CELL=sge["SGE_CELL"],
        )
        yield person


def as_user(user: UnixUser, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        env=user.env,
        user=user.name,
        group=user.name,
        extra_groups=[],
        cwd=user.home,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write(user: UnixUser, name: str, text: str) -> Path:
    path = user.home / name
    path.write_text(text)
    subprocess.run(["chown", user.name, str(path)], check=True, timeout=10)
    return path


def qsub(user: UnixUser, script: Path) -> str:
    done = as_user(user, "qsub", "-terse", str(script))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.timeout(120)
def test_a_qsub_script_runs_the_users_script_on_the_granted_gpu(
    grid_engine: GridEngine, user: UnixUser
) -> None:
    write(user, "script.py", USER_SCRIPT)
    job = qsub(user, write(user, "job.sh", SGE_SCRIPT))
    grid_engine.wait_gone(job, timeout=90)
    output = (user.home / f"apportion-{job}.out").read_text()
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert len(lines) == 1, output
    found = json.loads(lines[0])
    # The starter named device 1 for -l gpu=1; the task holding it sees exactly that.
    assert found["job"] == "1" and found["task"] == "1", output
    assert found["sum"] == 6
    # The worker offered what Grid Engine granted: 2 slots, h_vmem 2G x 2, the GPU.
    assert found["resources"] == {"cpus": 2, "gpu": 1, "memory": 4 * 2**30}, output
    assert re.search(r"worker \S+ drained", output), output
    assert not Path(found["scheduler_file"]).exists()  # removed at the end
    poll(lambda: not user.processes(), 20, "the user's processes to end")


#: A job of the parallel environment whose tasks Grid Engine starts (control_slaves
#: TRUE): the worker supervisor starts through ``qrsh -inherit`` on the job's host.
TIGHT_SCRIPT = """\
#!/bin/sh
#$ -S /bin/sh
#$ -cwd
#$ -j y
#$ -o apportion-$JOB_ID.out
#$ -pe tight 2
#$ -l gpu=1,h_vmem=1G,h_rt=00:10:00
#$ -notify
#$ -V
exec apportion sge -- python tight.py
"""

#: Where the task ran: the worker's ancestors and the variables a qrsh task has.
TIGHT_USER_SCRIPT = """\
import json
import os
import time

import psutil

from apportion import Client


def where():
    return {
        "ancestors": [process.name() for process in psutil.Process().parents()],
        "job_script": os.environ.get("JOB_SCRIPT"),
        # What Grid Engine wrote of the task's environment, for the host's users to read.
        "spooled": open(
            os.path.join(os.environ["SGE_JOB_SPOOL_DIR"], "environment"), errors="replace"
        ).read(),
    }


with Client() as client:
    found = client.submit(where, pure=False).result()
    (worker,) = client.scheduler_info()["workers"].values()
    found.update(name=worker["name"], resources=worker["resources"])
    print(json.dumps(found), flush=True)
    time.sleep(600)  # until qdel
"""


@pytest.mark.timeout(120)
def test_in_a_tight_parallel_environment_the_workers_start_through_qrsh_inherit(
    grid_engine: GridEngine, user: UnixUser
) -> None:
    write(user, "tight.py", TIGHT_USER_SCRIPT)
    job = qsub(user, write(user, "tight.sh", TIGHT_SCRIPT))
    out = user.home / f"apportion-{job}.out"
    poll(lambda: out.exists() and "{" in out.read_text(), 60, "the script's line")
    # qdel of a -notify job: SIGUSR2 to every task, SIGKILL 10 s later.
    assert as_user(user, "qdel", job).returncode == 0
    grid_engine.wait_gone(job, timeout=30)
    output = out.read_text()
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert len(lines) == 1, output
    found = json.loads(lines[0])
    # The task's worker runs under Grid Engine's qrsh_starter, as a task of the job
    # (JOB_SCRIPT=QRSH). No credential went through qrsh: Grid Engine spools the
    # task's environment where the host's users may read it (the worker took its
    # credentials from the scheduler file).
    assert "qrsh_starter" in found["ancestors"], found
    assert found["job_script"] == "QRSH", found
    assert "JOB_SCRIPT=QRSH" in found["spooled"], found["spooled"]
    assert "APPORTION_TOKEN" not in found["spooled"] and "PRIVATE KEY" not in found["spooled"]
    assert found["name"] == grid_engine.host
    # The host's grant: its 2 slots, h_vmem 1G x 2, the job's one GPU (per job: the
    # master host's).
    assert found["resources"]["cpus"] == 2 and found["resources"]["memory"] == 2 * 2**30
    assert found["resources"]["gpu"] == 1, found
    assert "through qrsh -inherit" in output, output
    # qdel's warning stopped apportion sge, which drained the worker through qrsh
    # (the end of its input), and nothing is left behind.
    assert "SIGUSR2 received; stopping" in output, output
    assert re.search(r"worker \S+ drained", output), output
    poll(lambda: not user.processes(), 20, "the user's processes to end")


@pytest.mark.timeout(120)
def test_an_sge_cluster_asks_for_a_gpu_job_for_gpu_work_and_deletes_it_idle(
    grid_engine: GridEngine, user: UnixUser
) -> None:
    write(user, "cluster.py", CLUSTER_SCRIPT)
    done = as_user(user, "python", "cluster.py", timeout=110)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["shapes"] == ["gpu"], found  # GPU work brought a GPU job, nothing else
    assert found["mask"] == "1"
    assert found["resources"] == {"cpus": 1, "gpu": 1}
    job = found["worker"].removeprefix("sge-")
    output = (user.home / "jobs" / f"apportion-gpu-{job}.out").read_text()
    # qdel of the idle job warned it first (-notify): its worker drained and left.
    assert "SIGTERM received; draining" in output, output
    grid_engine.wait_gone(job, timeout=30)
    poll(lambda: not user.processes(), 20, "the user's processes to end")


#: A client of the user's scheduler (its file is theirs alone: a client of another
#: account's refuses it).
ALLOC_CLIENT = """\
import json
import sys

from apportion import Client, task_environment


def gpu_task():
    return task_environment()["CUDA_VISIBLE_DEVICES"]


with Client(scheduler_file=sys.argv[1], timeout=20) as client:
    seen = client.submit(gpu_task, resources={"gpu": 1}).result(timeout=60)
    (worker,) = client.scheduler_info()["workers"].values()
    print(json.dumps({"seen": seen, "worker": worker["name"]}))
"""


@pytest.mark.timeout(120)
def test_apportion_alloc_sge_grows_a_running_cluster_and_deletes_its_jobs_on_exit(
    grid_engine: GridEngine, user: UnixUser
) -> None:
    file = user.home / "scheduler.json"
    user.start("scheduler", "--port", "0", "--no-journal", "--scheduler-file", str(file))
    poll(file.exists, 30, "the scheduler's file")  # alloc does not wait for it
    # A job has none of the submitter's environment: the prologue says where
    # apportion is, as `. ~/venv/bin/activate` would.
    prologue = f"export PYTHONPATH={user.env['PYTHONPATH']}"
    alloc = user.start(
        *["alloc", "sge", "--scheduler-file", str(file), "--gpus", "1", "--walltime", "10:00"],
        *["--python", user.python[0], "--prologue", prologue, "--interval", "0.3"],
        *["--idle-timeout", "600", "--log-directory", str(user.home / "jobs")],
    )
    write(user, "client.py", ALLOC_CLIENT)
    done = as_user(user, "python", "client.py", str(file), timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr + user.output()
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["seen"] == "1"  # the device the starter named for -l gpu=1
    job = str(found["worker"]).removeprefix("sge-")
    assert grid_engine.state(job) == "r"
    alloc.send_signal(signal.SIGINT)  # leaving: the jobs it submitted are deleted
    assert alloc.wait(30) == 0, user.output()
    grid_engine.wait_gone(job, timeout=30)
    output = (user.home / "jobs" / f"apportion-sge-{job}.out").read_text()
    assert "SIGTERM received; draining" in output, output  # qdel's -notify warning
