"""What one worker job asks Slurm for, and the batch script that asks it: pure.

A ``JobTemplate`` is written in dask-jobqueue's words (``cores``, ``memory``,
``processes``, ``walltime``, ``job_extra_directives``...) plus ``gpus`` and
``resources``. From it come the batch script ``sbatch`` receives and the
``JobShape`` the allocator plans with. The two must agree: the script's workers
declare ``--resources slurm`` (what Slurm granted the node: cpus, memory and the GPUs
of the GRES mask, ``deploy.slurm_env``) plus the template's own ``resources``, and
the shape is that same supply as the template states it.

The credentials never appear in the script: the scheduler file it names holds the
secret (mode 0600), and TLS material, when there is any, is named by files of the
same privacy (``APPORTION_TLS_*`` paths).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from apportion.core.resources import SCALE, parse_amount, parse_supply
from apportion.deploy.allocator import ENDED, QUEUED, RUNNING, JobShape, JobState

#: Seconds before the walltime at which a job's workers drain and leave.
DRAIN_MARGIN = 60.0

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def walltime_seconds(text: str) -> int:
    """Slurm's time formats: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``; ``ValueError`` for anything else.

    >>> walltime_seconds("01:30:00"), walltime_seconds("2-00"), walltime_seconds("90")
    (5400, 172800, 5400)
    """
    found = _WALLTIME.match(text.strip())
    if not found:
        raise ValueError(
            f"walltime {text!r}: give Slurm's format, e.g. 01:00:00, 90 (minutes) or 2-00:00:00"
        )
    days, first, second, third = found.groups()
    numbers = [int(first)] + [int(n) for n in (second, third) if n is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = [*numbers, 0, 0][:3]
        return int(days) * 86_400 + hours * 3600 + minutes * 60 + seconds
    if len(numbers) == 3:
        return numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    minutes, seconds = [*numbers, 0][:2]
    return minutes * 60 + seconds


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """One kind of worker job. ``memory`` is per job (``"16GiB"``), split evenly
    among its ``processes``; ``gpus`` asks for ``--gres=gpu:N``; ``resources`` adds
    pools of the project's own (``"licence=2"``), given to every process.

    The class attributes are what differs between batch systems; ``SGEJobTemplate``
    (``deploy.sge_template``) sets its own."""

    #: The word in ``--resources`` that stands for the job's grant.
    GRANT: ClassVar[str] = "slurm"
    #: The variable holding the job's id inside the script.
    JOB_ID_VARIABLE: ClassVar[str] = "SLURM_JOB_ID"
    #: What starts a directive line of the script.
    DIRECTIVE: ClassVar[str] = "#SBATCH"

    name: str = "cpu"
    cores: int = 1
    memory: str | None = None
    processes: int = 1
    gpus: int = 0
    resources: str = ""
    walltime: str = "01:00:00"
    queue: str | None = None
    account: str | None = None
    job_extra_directives: Sequence[str] = ()
    job_script_prologue: Sequence[str] = ()
    #: The Python with apportion installed on the compute nodes (default: this one's,
    #: as on a shared file system it is the same path there).
    python: str = sys.executable
    #: Worker options added to every worker's command line.
    worker_extra_args: Sequence[str] = ()
    #: Where job output goes (None: the cluster's log directory, else the job's own).
    log_directory: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cores < 1 or self.processes < 1:
            raise ValueError(f"job {self.name!r}: cores and processes must be 1 or more")
        if self.cores % self.processes:
            raise ValueError(
                f"job {self.name!r}: {self.cores} cores do not split into "
                f"{self.processes} processes evenly"
            )
        if self.gpus < 0:
            raise ValueError(f"job {self.name!r}: gpus must be 0 or more")
        if self.gpus % self.processes and self.gpus > self.processes:
            raise ValueError(
                f"job {self.name!r}: {self.gpus} GPUs do not split into "
                f"{self.processes} processes evenly"
            )
        walltime_seconds(self.walltime)
        parse_supply(self.resources)  # a malformed spec fails here, not in the job
        if self.memory is not None:
            parse_amount(self.memory, name="memory")

    @property
    def nthreads(self) -> int:
        return self.cores // self.processes

    def memory_mib(self) -> int | None:
        if self.memory is None:
            return None
        return max(1, parse_amount(self.memory, name="memory") // SCALE // 2**20)

    def shape(self) -> JobShape:
        """What each of this job's worker processes offers, as ``--resources slurm``
        will find it in the job: cpus, memory and GPUs split among the processes."""
        amounts, units = parse_supply(self.resources)
        supply = dict(amounts)
        supply["cpus"] = self.nthreads * SCALE
        mib = self.memory_mib()
        if mib is not None:
            supply["memory"] = mib * 2**20 // self.processes * SCALE
        indexed = set(units)
        if self.gpus:
            supply["gpu"] = max(1, self.gpus // self.processes) * SCALE
            indexed.add("gpu")
        return JobShape(self.name, self.processes, self.nthreads, supply, frozenset(indexed))

    def directives(self) -> list[str]:
        lines = [
            f"--job-name=apportion-{self.name}",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={self.cores}",
            f"--time={self.walltime}",
            f"--output={self.log_directory or '.'}/%x-%j.out",
        ]
        mib = self.memory_mib()
        if mib is not None:
            lines.append(f"--mem={mib}M")
        if self.gpus:
            lines.append(f"--gres=gpu:{self.gpus}")
        if self.queue:
            lines.append(f"--partition={self.queue}")
        if self.account:
            lines.append(f"--account={self.account}")
        return lines + list(self.job_extra_directives)

    def worker_command(self, scheduler_file: str) -> list[str]:
        """The worker supervisor the job runs (the job id expanded by the shell), named
        ``GRANT-JOBID`` (``job_of_worker`` reads the id back)."""
        lifetime = max(0.0, walltime_seconds(self.walltime) - DRAIN_MARGIN)
        argv = [self.python, "-m", "apportion.cli.main", "worker"]
        argv += ["--scheduler-file", scheduler_file]
        argv += ["--name", f"{self.GRANT}-${{{self.JOB_ID_VARIABLE}}}"]
        argv += ["--nworkers", str(self.processes), "--nthreads", str(self.nthreads)]
        argv += ["--resources", f"{self.GRANT} {self.resources}".strip()]
        if self.processes > 1:
            argv += ["--split-units"]
        argv += ["--lifetime", f"{lifetime:g}", "--drain-timeout", "20"]
        return argv + list(self.worker_extra_args)

    def script(self, scheduler_file: str, tls_files: Mapping[str, str] | None = None) -> str:
        """The batch script: directives, prologue, then ``exec`` of the worker, so that
        ``scancel``'s SIGTERM reaches it and it drains."""
        lines = ["#!/usr/bin/env bash"]
        lines += [f"{self.DIRECTIVE} {directive}" for directive in self.directives()]
        lines += list(self.job_script_prologue)
        for name, value in {**self.environment, **(tls_files or {})}.items():
            lines.append(f"export {name}={shlex.quote(value)}")
        worker = self.worker_command(scheduler_file)
        lines.append("exec " + " ".join(quote_arg(arg, self.JOB_ID_VARIABLE) for arg in worker))
        return "\n".join(lines) + "\n"


def quote_arg(arg: str, variable: str) -> str:
    """``arg`` quoted for the shell, but for ``${variable}`` in it, left to expand."""
    # ${VARIABLE} (the job id) must reach the shell unquoted; everything else is quoted.
    reference = f"${{{variable}}}"
    if reference in arg:
        head, _, tail = arg.partition(reference)
        return f"{shlex.quote(head)}{reference}{shlex.quote(tail) if tail else ''}"
    return shlex.quote(arg)


def parse_job_id(output: str) -> str:
    """The job id ``sbatch --parsable`` printed (``1234`` or ``1234;cluster``)."""
    text = output.strip().splitlines()[-1] if output.strip() else ""
    job = text.split(";", 1)[0].strip()
    if not job.isdigit():
        raise ValueError(f"sbatch printed no job id: {output.strip()!r}")
    return job


#: Slurm's job states by what they mean to the allocator; any other is ended.
SLURM_PHASES = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED"), QUEUED),
    **dict.fromkeys(("RUNNING", "COMPLETING", "STAGE_OUT"), RUNNING),
}


def parse_states(output: str) -> dict[str, JobState]:
    """``squeue --noheader --format='%i %T'`` lines as job id -> state."""
    states = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 2:
            word = fields[1].upper()
            states[fields[0]] = JobState(SLURM_PHASES.get(word, ENDED), word)
    return states
