"""What ``apportion slurm`` starts, decided without starting anything.

Theory of operation
-------------------
``apportion slurm -- COMMAND`` runs in the first node of an allocation (the batch
script, or an ``salloc`` shell). It starts the scheduler there, one worker supervisor
per node with a single ``srun`` step, waits until every node's workers have
registered, runs COMMAND, and tears all of it down. This module holds the
decisions, as data and pure functions tested in milliseconds; ``slurm_launch`` does
the I/O.

- ``allocation`` reads the job from its environment, or raises ``NotInAllocation``.
- ``scheduler_host``: loopback when the job has one node (nothing else needs to
  reach it), else this node's address, which every node can reach.
- ``worker_step``: the ``srun`` command. One task per node (``--ntasks-per-node=1``),
  each a supervisor of ``--nworkers`` processes offering ``--resources slurm``, that
  is what Slurm granted that node. ``--overlap`` lets the step share the job's CPUs,
  memory and GPUs with every other step, so that COMMAND may run ``srun`` itself
  while the workers hold on to everything. A small ``sh -c`` names each supervisor
  after its node (``$SLURMD_NODENAME``, set by Slurm per task), which is how
  ``missing_workers`` tells which node is missing; on several nodes it also gives
  each worker its node's address to serve data on.
- ``missing_workers`` compares the names registered with the nodes expected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apportion.deploy.slurm_env import JOB_ID, SLURM, NotInAllocation

#: Set by Slurm in every allocation: how many nodes the job has, and which.
NUM_NODES = "SLURM_JOB_NUM_NODES"
NODELIST = "SLURM_JOB_NODELIST"

#: The variable COMMAND (and ``Client()`` in it) finds the scheduler file by.
SCHEDULER_FILE_VARIABLE = "APPORTION_SCHEDULER_FILE"

LOOPBACK = "127.0.0.1"

#: Run by ``sh -c`` on each node: the worker command follows as "$@".
_NAME_BY_NODE = 'exec "$@" --name "$SLURMD_NODENAME"'
#: The same, also serving data on the node's own address ("$1" is the Python).
_NAME_AND_HOST_BY_NODE = (
    'exec "$@" --name "$SLURMD_NODENAME" --host "$("$1" -c '
    "'import socket; print(socket.gethostbyname(socket.gethostname()))')\""
)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """The Slurm job this process runs in."""

    job_id: str
    #: Nodes in the job (``SLURM_JOB_NUM_NODES``).
    nodes: int
    #: Their names in Slurm's compressed form (``node[01-04]``).
    nodelist: str


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    """The options of ``apportion slurm``."""

    #: Worker processes per node (each node's supervisor runs this many).
    nworkers_per_node: int = 1
    #: Threads per worker process; None: the node's granted CPUs shared among them.
    nthreads: int | None = None
    #: Pools added to what Slurm granted (``licence=2``); "" for none.
    resources: str = ""
    #: Seconds a worker gets to finish its tasks once COMMAND has ended.
    drain_timeout: float = 10.0
    #: Seconds to wait for every node's workers before giving up.
    register_timeout: float = 120.0


def slurm_job(environ: Mapping[str, str]) -> SlurmJob:
    """The job ``environ`` belongs to; ``NotInAllocation`` outside one, ``ValueError`` if
    Slurm's variables are malformed."""
    job = environ.get(JOB_ID, "").strip()
    if not job:
        raise NotInAllocation(
            f"not inside a Slurm allocation ({JOB_ID} is not set): run `apportion slurm` "
            "from an sbatch script or an salloc shell"
        )
    text = environ.get(NUM_NODES, "1").strip()
    if not re.fullmatch(r"[1-9]\d*", text):
        raise ValueError(f"{NUM_NODES}={text!r}: expected a positive whole number")
    return SlurmJob(job, int(text), environ.get(NODELIST, "").strip())


def default_scheduler_file(job: SlurmJob, cwd: Path) -> Path:
    """Where the scheduler file goes unless ``--scheduler-file`` says: the job's working
    directory, which the nodes of a cluster share, named for the job so that two jobs
    started from one directory do not take each other's."""
    return cwd / f"apportion-scheduler-{job.job_id}.json"


def scheduler_host(job: SlurmJob, node_address: str) -> str:
    """The interface the scheduler listens on (see the module docstring)."""
    return LOOPBACK if job.nodes == 1 else node_address


def worker_resources(options: LaunchOptions) -> str:
    """The ``--resources`` of every worker: the grant, plus the pools given."""
    return f"{SLURM} {options.resources}".strip()


def worker_step(
    python: Sequence[str], job: SlurmJob, options: LaunchOptions, scheduler_file: Path
) -> list[str]:
    """The ``srun`` command that starts one worker supervisor on every node.

    ``python`` is how to run this Python (``[sys.executable]``); the worker is started
    as ``python -m apportion.cli.main worker``, so the same installation runs on each
    node. Credentials are not here: they reach the workers through the environment,
    which srun passes on.
    """
    srun = [
        "srun",
        f"--nodes={job.nodes}",
        f"--ntasks={job.nodes}",
        "--ntasks-per-node=1",
        "--overlap",
        f"--job-name={worker_step_name(job)}",
    ]
    wrapper = _NAME_BY_NODE if job.nodes == 1 else _NAME_AND_HOST_BY_NODE
    worker = [*python, "-m", "apportion.cli.main", "worker"]
    worker += ["--scheduler-file", str(scheduler_file)]
    worker += ["--nworkers", str(options.nworkers_per_node)]
    worker += ["--resources", worker_resources(options)]
    worker += ["--drain-timeout", repr(options.drain_timeout)]
    if options.nthreads is not None:
        worker += ["--nthreads", str(options.nthreads)]
    return [*srun, "sh", "-c", wrapper, "sh", *worker]


def worker_step_name(job: SlurmJob) -> str:
    """The name of the workers' step, by which ``step_to_signal`` finds it again."""
    return f"apportion-workers-{job.job_id}"


def step_to_signal(squeue_steps: str, job: SlurmJob) -> str | None:
    """``JOB.STEP`` of the workers' step in ``squeue --steps --format="%i %j"`` output.

    The workers are stopped with ``scancel --signal=TERM JOB.STEP``, which delivers
    SIGTERM to each worker supervisor so that it drains: srun itself, sent SIGTERM,
    ends its step at once (the tasks are killed, not drained).
    """
    for line in squeue_steps.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == worker_step_name(job):
            return fields[0]
    return None


_SUFFIX = re.compile(r"^-\d+$")


def _node_of(name: str, nodes: Sequence[str]) -> str | None:
    for node in nodes:
        if name == node or (name.startswith(node) and _SUFFIX.match(name[len(node) :])):
            return node
    return None


def missing_workers(nodes: Sequence[str], per_node: int, names: Iterable[str]) -> dict[str, int]:
    """Nodes with fewer than ``per_node`` workers registered, with how many they have.

    A supervisor of one process names its worker after the node (``node1``); one of
    several suffixes them (``node1-0``, ``node1-1``).
    """
    counts = dict.fromkeys(nodes, 0)
    for name in names:
        node = _node_of(name, nodes)
        if node is not None:
            counts[node] += 1
    return {node: count for node, count in counts.items() if count < per_node}


def missing_text(missing: Mapping[str, int], per_node: int, waited: float) -> str:
    """One line naming the nodes whose workers did not all register in time."""
    parts = [f"{node} ({count} of {per_node})" for node, count in missing.items()]
    return (
        f"workers did not register within {waited:g}s on {len(parts)} node(s): "
        f"{', '.join(parts)}; see the worker step's output above"
    )
