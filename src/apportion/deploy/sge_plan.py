"""What ``apportion sge`` starts, decided without starting anything: pure.

``apportion sge -- COMMAND`` runs in a Grid Engine job (a ``qsub`` script, or a
``qrsh``/``qlogin`` session), on the job's master host. It starts the scheduler,
one worker supervisor per host of the job offering ``--resources sge`` (what Grid
Engine granted the job on that host: ``deploy.sge_env``), waits until every host's
workers have registered, runs COMMAND, and tears everything down
(``deploy.launch``).

How each host's supervisor starts (``plan_workers``):

- Through ``qrsh -inherit HOST``, Grid Engine's own way into a host of a parallel
  job ("tight integration"), as ``apportion slurm`` uses ``srun``: the task runs
  under Grid Engine's control, in the slots granted there, and ends with the job.
  It needs the parallel environment's ``control_slaves TRUE`` (``qconf -sp PE``).
  The task is ``apportion.deploy.sge_task``, which drains its supervisor when our
  end of its standard input closes (qrsh forwards that, not signals).
- On the master host, through qrsh too when a slot there is free for a task: with
  ``job_is_first_task TRUE`` the job script holds one of the host's slots, so a
  master host of one slot has none, and its supervisor starts here instead, as a
  child in the job script's own slot. A job outside a parallel environment (no
  ``PE_HOSTFILE``) has nothing to inherit: its supervisor starts here too.
- A parallel environment with ``control_slaves FALSE`` refuses ``qrsh -inherit``:
  the supervisor starts here, on this host only, and ``warning`` says what the job
  gave up and what to set. The job still runs, on part of its slots, rather than
  failing after its wait in the queue.
- When ``qconf -sp`` cannot be asked (None), the usual tight integration is
  assumed for the other hosts (they would be unreachable otherwise), and the
  master host's supervisor starts here, which works either way.

On several hosts the scheduler listens on this host's address and each worker
serves data on its own (``sge_task --own-address``); on one, loopback.

No credential crosses ``qrsh``: Grid Engine writes a task's environment to a file
every user of that host may read (its execd spool). The workers started through
it find the secret and the TLS credentials in the scheduler file (mode 0600, on the
shared working directory), which ``apportion sge`` completes with them.

The processes stay in the job's process group, so that Grid Engine, which ends a
job by signalling that group, ends them with it; each ignores ``SIGUSR2``, the
warning a ``-notify`` job gets before ``qdel``'s SIGKILL (Grid Engine sends it to
every task of the job), which ``apportion sge`` alone answers by draining the
workers and stopping the scheduler in order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apportion.deploy.sge_env import SGE, SGEJob, host_index
from apportion.deploy.slurm_plan import LaunchOptions

#: Run by ``sh -c``: the command follows as "$@", with SIGUSR2 ignored (inherited
#: across exec), so that ``-notify``'s warning to the group does not kill it.
IGNORE_NOTIFY = 'trap "" USR2; exec "$@"'

#: The module each ``qrsh -inherit`` task runs: the supervisor, drained on EOF.
TASK_MODULE = "apportion.deploy.sge_task"
#: Its option to serve data on the host's own address (on several hosts).
OWN_ADDRESS = "--own-address"


@dataclass(frozen=True, slots=True)
class PESettings:
    """What ``qconf -sp PE`` says of starting tasks in a job of the parallel environment."""

    name: str
    #: Grid Engine starts the tasks (``qrsh -inherit`` is allowed).
    control_slaves: bool
    #: The job script is the first task: it holds one slot of the master host.
    job_is_first_task: bool


@dataclass(frozen=True, slots=True)
class HostStart:
    """One host's worker supervisor, as started."""

    #: The host as the ``PE_HOSTFILE`` names it: its workers register under this name.
    host: str
    #: The job's slots there.
    slots: int
    #: Through ``qrsh -inherit`` (its standard input is the drain), else a child here.
    qrsh: bool
    #: The command line, wrappers included.
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """Every host's start, this host's first."""

    starts: tuple[HostStart, ...]
    #: What the user should hear (the other hosts left out), or None.
    warning: str | None = None

    @property
    def several_hosts(self) -> bool:
        """Whether other hosts must reach the scheduler."""
        return len(self.starts) > 1

    @property
    def through_qrsh(self) -> bool:
        return any(start.qrsh for start in self.starts)


def parse_pe(name: str, qconf_sp: str) -> PESettings:
    """``qconf -sp NAME``'s output; ``ValueError`` without the two settings."""
    found: dict[str, str] = {}
    for line in qconf_sp.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            found[fields[0]] = fields[1]
    flags = {}
    for key in ("control_slaves", "job_is_first_task"):
        value = found.get(key, "")
        if not re.fullmatch(r"(?i)true|false", value):
            raise ValueError(f"qconf -sp {name}: {key} is {value or 'missing'}, not TRUE or FALSE")
        flags[key] = value.lower() == "true"
    return PESettings(name, flags["control_slaves"], flags["job_is_first_task"])


def plan_workers(
    job: SGEJob,
    hostname: str,
    pe: PESettings | None,
    parallel: bool,
    python: Sequence[str],
    options: LaunchOptions,
    scheduler_file: Path,
) -> WorkerPlan:
    """Each host's start (see the module docstring). ``hostname`` is this host's
    name, ``parallel`` whether the job has a ``PE_HOSTFILE``, ``pe`` its parallel
    environment's settings (None: unknown)."""
    here = host_index(job, hostname) if parallel else 0
    order = [here, *(i for i in range(len(job.hosts)) if i != here)]
    several = parallel and len(job.hosts) > 1
    warning = None
    if not parallel or (pe is not None and not pe.control_slaves):
        if several:
            assert pe is not None
            host, slots = job.hosts[here]
            warning = (
                f"parallel environment {pe.name} has control_slaves FALSE, so qrsh -inherit "
                f"cannot start workers on the job's other hosts: workers on {host} only "
                f"({slots} of {job.slots} slots); ask for a parallel environment with "
                f"control_slaves TRUE (qconf -mp {pe.name})"
            )
        order, several = [here], False
    starts = []
    for index in order:
        host, slots = job.hosts[index]
        worker = worker_command(python, options, scheduler_file, host)
        if not _through_qrsh(index == here, slots, parallel, pe):
            starts.append(HostStart(host, slots, False, tuple(ignoring_notify(worker))))
            continue
        task = [*python, "-m", TASK_MODULE, *([OWN_ADDRESS] if several else []), "--", *worker]
        qrsh = ["qrsh", "-inherit", "-V", host, *task]
        starts.append(HostStart(host, slots, True, tuple(ignoring_notify(qrsh))))
    return WorkerPlan(tuple(starts), warning)


def _through_qrsh(master: bool, slots: int, parallel: bool, pe: PESettings | None) -> bool:
    if not parallel or (pe is not None and not pe.control_slaves):
        return False
    if not master:
        return True
    # The master host: a task needs a slot the job script does not hold.
    return pe is not None and slots - (1 if pe.job_is_first_task else 0) >= 1


def qrsh_environment(environ: Mapping[str, str], credentials: Sequence[str]) -> dict[str, str]:
    """What ``qrsh -inherit -V`` hands each task: ``environ`` less the credential
    variables (Grid Engine writes it where the host's users can read it)."""
    return {name: value for name, value in environ.items() if name not in credentials}


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
