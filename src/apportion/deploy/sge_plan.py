"""What ``apportion sge`` starts, decided without starting anything: pure.

``apportion sge -- COMMAND`` runs in a Grid Engine job (a ``qsub`` script, or a
``qrsh``/``qlogin`` session). It starts the scheduler on loopback and one worker
supervisor on this host offering ``--resources sge`` (what Grid Engine granted the
job here: ``deploy.sge_env``), waits until its workers have registered, runs
COMMAND, and tears everything down (``deploy.launch``).

- One host: a parallel job spread over several hosts (``PE_HOSTFILE`` lists more
  than one) is refused in one line, since starting workers on the others needs
  ``qrsh -inherit``, which apportion does not do yet.
- The processes stay in the job's process group, so that Grid Engine, which ends a
  job by signalling that group, ends them with it; each ignores ``SIGUSR2``, the
  warning a ``-notify`` job gets before ``qdel``'s SIGKILL, which ``apportion sge``
  alone answers by draining the workers and stopping the scheduler in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from apportion.deploy.sge_env import SGE, SGEJob, describe_hosts
from apportion.deploy.slurm_plan import LaunchOptions

#: Run by ``sh -c``: the command follows as "$@", with SIGUSR2 ignored (inherited
#: across exec), so that ``-notify``'s warning to the group does not kill it.
IGNORE_NOTIFY = 'trap "" USR2; exec "$@"'


def check_one_host(job: SGEJob) -> None:
    """``ValueError`` for a job on several hosts (see the module docstring)."""
    if len(job.hosts) > 1:
        raise ValueError(
            f"job {job.job_id} has {len(job.hosts)} hosts ({describe_hosts(job.hosts)}): "
            "apportion sge starts workers on this host only; use a parallel environment "
            "with allocation_rule $pe_slots, or start `apportion worker --resources sge` "
            "on the other hosts with qrsh -inherit"
        )


def default_scheduler_file(job: SGEJob, cwd: Path) -> Path:
    """The job's working directory, named for the job (and array task), so that two
    jobs started from one directory do not take each other's."""
    task = f".{job.task_id}" if job.task_id is not None else ""
    return cwd / f"apportion-scheduler-{job.job_id}{task}.json"


def ignoring_notify(argv: Sequence[str]) -> list[str]:
    """``argv`` run with SIGUSR2 ignored."""
    return ["sh", "-c", IGNORE_NOTIFY, "sh", *argv]


def worker_command(
    python: Sequence[str], options: LaunchOptions, scheduler_file: Path, name: str
) -> list[str]:
    """The worker supervisor on this host, named ``name`` (the host)."""
    worker = [*python, "-m", "apportion.cli.main", "worker"]
    worker += ["--scheduler-file", str(scheduler_file), "--name", name]
    worker += ["--nworkers", str(options.nworkers_per_node)]
    worker += ["--resources", f"{SGE} {options.resources}".strip()]
    worker += ["--drain-timeout", repr(options.drain_timeout)]
    if options.nthreads is not None:
        worker += ["--nthreads", str(options.nthreads)]
    return worker
