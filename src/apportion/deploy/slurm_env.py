"""What Slurm granted this node, read from a job's environment: ``--resources slurm``.

Theory of operation
-------------------
Inside an allocation, Slurm describes the node's share of the job in environment
variables. ``slurm_grant`` reads them from a mapping (``os.environ`` in use, a plain
dict in tests) and ``grant_supply`` turns the grant into pools in the shape
``worker.detect`` gives for ``auto``, so that the worker's CLI replaces the word
``slurm`` in a spec exactly as it replaces ``auto``:

- ``cpus`` from ``SLURM_CPUS_ON_NODE``;
- ``memory`` from ``SLURM_MEM_PER_NODE`` (MiB), else ``SLURM_MEM_PER_CPU`` (MiB) times
  the CPUs; with neither (a cluster that does not allocate memory) there is no memory
  pool, since the machine's memory is not the job's to offer;
- ``gpu=[...]`` from the GRES mask: ``CUDA_VISIBLE_DEVICES`` as Slurm set it, else
  ``SLURM_STEP_GPUS``, else ``SLURM_JOB_GPUS``. The labels are the mask's entries as
  written, so that a task's ``CUDA_VISIBLE_DEVICES`` is a subset of the node's grant.

Malformed values raise ``ValueError`` naming the variable: a grant half understood
would become a wrong pool. No ``SLURM_JOB_ID`` raises ``NotInAllocation``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from apportion.core.resources import SCALE, Amounts, Units
from apportion.worker.detect import CPUS, GPU, MEMORY, parse_mask

#: The word in a resource spec that stands for the granted pools.
SLURM = "slurm"

#: Set in every allocation (batch script, salloc shell, srun step); its absence
#: means we are not in one.
JOB_ID = "SLURM_JOB_ID"

CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"
MEM_PER_NODE = "SLURM_MEM_PER_NODE"
MEM_PER_CPU = "SLURM_MEM_PER_CPU"
#: Where the GPU mask is read from, first found wins.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")

_COUNT = re.compile(r"^\s*(\d+)\s*$")
#: Slurm writes sizes in MiB, sometimes with a unit letter (``4096M``, ``4G``).
_MIB = re.compile(r"^\s*(\d+)\s*([KMGT]?)\s*$", re.IGNORECASE)
_MIB_FACTOR = {"": 1, "K": 2**-10, "M": 1, "G": 2**10, "T": 2**20}


class NotInAllocation(ValueError):
    """The environment has no ``SLURM_JOB_ID``: this process runs outside any job."""


@dataclass(frozen=True, slots=True)
class SlurmGrant:
    """This node's share of the job, as Slurm states it."""

    #: CPUs allocated on this node (at least 1).
    cpus: int
    #: Bytes of memory allocated on this node; None when Slurm allocates none.
    memory: int | None
    #: GPU mask entries in order ([] when no GPU is granted, never None).
    gpus: tuple[str, ...]


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is that of a process inside a Slurm allocation."""
    return bool(environ.get(JOB_ID, "").strip())


def _count(environ: Mapping[str, str], name: str) -> int:
    value = environ.get(name)
    if value is None:
        raise ValueError(f"{name} is not set: Slurm sets it in every job step")
    match = _COUNT.match(value)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"{name}={value!r}: expected a positive whole number")
    return int(match.group(1))


def _mebibytes(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None:
        return None
    match = _MIB.match(value)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"{name}={value!r}: expected a size in MiB, like 4096 or 4096M")
    return int(int(match.group(1)) * _MIB_FACTOR[match.group(2).upper()] * 2**20)


def _gpus(environ: Mapping[str, str]) -> tuple[str, ...]:
    for name in GPU_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        # Slurm writes "N/A" or nothing for a step without GPUs on some versions.
        if name != GPU_VARIABLES[0] and value.strip().upper() in ("", "N/A"):
            return ()
        try:
            mask = parse_mask(value)
        except ValueError as exc:
            raise ValueError(str(exc).replace("CUDA_VISIBLE_DEVICES", name, 1)) from None
        return tuple(mask or ())
    return ()


def slurm_grant(environ: Mapping[str, str]) -> SlurmGrant:
    """This node's grant, read from ``environ`` (see the module docstring).

    Raises ``NotInAllocation`` without ``SLURM_JOB_ID`` and ``ValueError`` for a
    variable that is missing or malformed.
    """
    if not in_allocation(environ):
        raise NotInAllocation(
            f"{SLURM!r} describes a Slurm allocation, and {JOB_ID} is not set: run "
            "inside sbatch, salloc or srun, or give the resources explicitly"
        )
    cpus = _count(environ, CPUS_ON_NODE)
    memory = _mebibytes(environ, MEM_PER_NODE)
    if memory is None:
        per_cpu = _mebibytes(environ, MEM_PER_CPU)
        memory = None if per_cpu is None else per_cpu * cpus
    return SlurmGrant(cpus, memory, _gpus(environ))


def grant_supply(grant: SlurmGrant) -> tuple[Amounts, Units]:
    """The pools ``slurm`` stands for: ``cpus``, ``memory`` (if granted), ``gpu=[...]``."""
    amounts: Amounts = {CPUS: grant.cpus * SCALE}
    units: Units = {}
    if grant.memory is not None:
        amounts[MEMORY] = grant.memory * SCALE
    if grant.gpus:
        units[GPU] = list(grant.gpus)
        amounts[GPU] = len(grant.gpus) * SCALE
    return amounts, units
