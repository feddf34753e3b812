"""What one worker job asks Grid Engine for, and what ``qsub`` and ``qstat`` say: pure.

``SGEJobTemplate`` is ``JobTemplate`` in Grid Engine's terms, after dask-jobqueue's
``SGECluster``: ``cores`` are slots of the parallel environment ``pe`` (``-pe PE
N``; a job without one gets one slot, so more than one core needs a ``pe``),
``memory`` is asked per slot as ``h_vmem`` (Grid Engine's limits are per slot),
``gpus`` as the consumable ``gpu_resource`` (``-l gpu=N``), ``walltime`` as
``h_rt``, ``queue`` as ``-q``, ``project`` as ``-P``, ``resource_spec`` as one more
``-l`` (``"mem_free=4G,scratch=10G"``), and ``job_extra_directives`` as lines of
their own.

``qdel`` kills a job's processes with SIGKILL unless it was submitted with
``-notify``, which sends SIGUSR2 first (the queue's ``notify`` time before). The
script asks for ``-notify`` and runs the worker with SIGUSR2 ignored, turning it into
a SIGTERM to the worker, which then drains: results still needed move to the
workers that stay. Its workers declare ``--resources sge``: what Grid Engine granted the job
(``deploy.sge_env``), so the template's shape and the worker's pools agree.

Grid Engine's job states are letters run together (``qw``, ``hqw``, ``r``, ``t``,
``Eqw``, ``dr``); ``sge_phase`` reads what they mean to the allocator: ``E`` (an
error that holds the job until a person clears it) is stuck, ``r``/``t`` running,
``q``/``w``/``h`` and the suspensions waiting.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from apportion.deploy.allocator import ENDED, QUEUED, RUNNING, STUCK, JobState
from apportion.deploy.job_template import JobTemplate, quote_arg, walltime_seconds

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class SGEJobTemplate(JobTemplate):
    """One kind of worker job for Grid Engine (see the module docstring). ``account``
    is not Grid Engine's word: give ``project``."""

    GRANT: ClassVar[str] = "sge"  # sge_env.SGE
    JOB_ID_VARIABLE: ClassVar[str] = "JOB_ID"
    DIRECTIVE: ClassVar[str] = "#$"

    #: The parallel environment giving ``cores`` slots on one host (``$pe_slots``).
    pe: str | None = None
    #: More ``-l`` requests, as qsub takes them (``"mem_free=4G,scratch=10G"``).
    resource_spec: str | None = None
    project: str | None = None
    #: The name of the site's GPU consumable complex.
    gpu_resource: str = "gpu"

    def __post_init__(self) -> None:
        JobTemplate.__post_init__(self)
        if self.account is not None:
            raise ValueError(
                f"job {self.name!r}: Grid Engine has projects, not accounts: give project="
            )
        if self.cores > 1 and not self.pe:
            raise ValueError(
                f"job {self.name!r}: {self.cores} cores need a parallel environment (pe=, "
                "qsub -pe) with $pe_slots: without one Grid Engine grants a job one slot"
            )
        for label, value in (("pe", self.pe), ("gpu_resource", self.gpu_resource)):
            if value is not None and not _NAME.match(value):
                raise ValueError(f"job {self.name!r}: {label}={value!r} is not a Grid Engine name")

    def directives(self) -> list[str]:
        lines = [
            f"-N apportion-{self.name}",
            "-S /bin/sh",
            "-cwd",
            "-j y",
            f"-o {self.log_directory or '.'}/$JOB_NAME-$JOB_ID.out",
            f"-l h_rt={h_rt(self.walltime)}",
        ]
        if self.pe:
            lines.append(f"-pe {self.pe} {self.cores}")
        mib = self.memory_mib()
        if mib is not None:
            lines.append(f"-l h_vmem={max(1, mib // self.cores)}M")
        if self.gpus:
            lines.append(f"-l {self.gpu_resource}={self.gpus}")
        if self.resource_spec:
            lines.append(f"-l {self.resource_spec}")
        if self.queue:
            lines.append(f"-q {self.queue}")
        if self.project:
            lines.append(f"-P {self.project}")
        return lines + list(self.job_extra_directives)

    def script(self, scheduler_file: str, tls_files: Mapping[str, str] | None = None) -> str:
        """The batch script (see the module docstring for the signals)."""
        lines = ["#!/bin/sh"]
        lines += [f"{self.DIRECTIVE} {directive}" for directive in self.directives()]
        lines.append(f"{self.DIRECTIVE} -notify")
        lines += list(self.job_script_prologue)
        for name, value in {**self.environment, **(tls_files or {})}.items():
            lines.append(f"export {name}={shlex.quote(value)}")
        worker = self.worker_command(scheduler_file)
        lines += [
            "trap '' USR2  # inherited: -notify's warning must not kill the worker",
            " ".join(quote_arg(arg, self.JOB_ID_VARIABLE) for arg in worker) + " &",
            "worker=$!",
            "# qdel: SIGUSR2 now, SIGKILL later; the worker drains on SIGTERM meanwhile.",
            "trap 'kill -TERM \"$worker\" 2>/dev/null' USR2 TERM",
            'wait "$worker"',
            "status=$?",
            'while kill -0 "$worker" 2>/dev/null; do wait "$worker"; status=$?; done',
            'exit "$status"',
        ]
        return "\n".join(lines) + "\n"


def h_rt(walltime: str) -> str:
    """Slurm-style ``walltime`` as Grid Engine's ``h_rt`` (``HH:MM:SS``).

    >>> h_rt("90"), h_rt("1-00:00:00")
    ('1:30:00', '24:00:00')
    """
    total = walltime_seconds(walltime)
    return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"


def parse_qsub_job_id(output: str) -> str:
    """The job id ``qsub -terse`` printed (``1234``; ``1234.1-10:1`` for an array)."""
    text = output.strip().splitlines()[-1].strip() if output.strip() else ""
    job = text.split(".", 1)[0]
    if not job.isdigit():
        raise ValueError(f"qsub printed no job id: {output.strip()!r}")
    return job


def sge_phase(word: str) -> str:
    """What a ``qstat`` state means to the allocator (see the module docstring)."""
    if "E" in word:
        return STUCK
    if "r" in word or "t" in word:
        return RUNNING
    if any(letter in word for letter in "qwhsST"):
        return QUEUED
    return ENDED


def parse_qstat(output: str) -> dict[str, JobState]:
    """``qstat -u USER`` as job id -> state: the lines under the header's dashes
    (``JOBID PRIOR NAME USER STATE ...``). An array job's tasks share one id; the
    first listed stands for them."""
    states: dict[str, JobState] = {}
    body = False
    for line in output.splitlines():
        if line.startswith("---"):
            body = True
            continue
        fields = line.split()
        if body and len(fields) >= 5 and fields[0].isdigit():
            states.setdefault(fields[0], JobState(sge_phase(fields[4]), fields[4]))
    return states
