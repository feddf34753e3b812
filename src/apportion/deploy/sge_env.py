"""What Grid Engine granted this job on this host: ``--resources sge``. Pure.

Theory of operation
-------------------
Grid Engine tells a job little in its environment: ``JOB_ID``, ``NSLOTS`` (slots in
all), ``PE_HOSTFILE`` (a file listing each host and its slots, in a parallel job),
``NHOSTS``, ``SGE_TASK_ID`` (``undefined`` outside an array job). What was granted of
the other resources (``-l gpu=1,h_vmem=4G``) is not in the environment: it is the
job's *hard resource list*, which ``qstat -j $JOB_ID`` prints, and a consumable
requested per slot (``consumable YES``) is granted once per slot while one of
``consumable JOB`` is granted once, as ``qconf -sc`` says of each. This module reads
those texts, handed to it (``deploy.sge_query`` runs the commands), and turns them
into pools in the shape ``worker.detect`` gives for ``auto``:

- ``cpus``: this host's slots (its line of the ``PE_HOSTFILE``, else ``NSLOTS``);
- ``memory``: ``h_vmem`` (per slot) times those slots, when the job asked for it;
  none otherwise, since the machine's memory is not the job's to offer;
- ``gpu``: the GPU consumable's grant (``gpu`` unless named otherwise) on this host:
  one per slot here for a per-slot consumable (``YES``), the job's count on every
  host for a per-host one (``HOST``, Univa/Altair's), and the job's count on the
  master host alone for a per-job one (``JOB``), which Grid Engine debits from the
  master queue only (complex(5)); the master host is the ``PE_HOSTFILE``'s first
  line. Grid Engine counts GPUs but does not say which: their labels come from
  ``CUDA_VISIBLE_DEVICES`` when the site's prolog or starter method sets it, else
  from ``SGE_HGR_<name>`` (Univa/Altair's resource maps); with neither the pool is
  a plain count, and tasks see no ``CUDA_VISIBLE_DEVICES`` (``grant_note`` says so).

Malformed or contradictory values raise ``ValueError`` naming their source; no
``JOB_ID`` raises ``NotInSGEJob``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from apportion.core.resources import SCALE, Amounts, Units
from apportion.worker.detect import CPUS, GPU, MEMORY, parse_mask

#: The word in a resource spec that stands for the granted pools (a worker loads
#: this module, not the job template's, whose ``GRANT`` is the same word).
SGE = "sge"

#: Set in every Grid Engine job; with ``SGE_TASK_ID`` (set in every job too, to
#: ``undefined`` outside an array) it tells a Grid Engine job from other systems'.
JOB_ID = "JOB_ID"
TASK_ID = "SGE_TASK_ID"
NSLOTS = "NSLOTS"
PE_HOSTFILE = "PE_HOSTFILE"

#: The consumable GPUs are counted by, unless told otherwise.
GPU_COMPLEX = "gpu"

#: Grid Engine's memory suffixes: upper case are powers of 1024, lower of 1000.
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KkMmGgTt]?)\s*$")
_FACTOR = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_FACTOR |= {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class NotInSGEJob(ValueError):
    """The environment has no ``JOB_ID`` and ``SGE_TASK_ID``: not a Grid Engine job."""


@dataclass(frozen=True, slots=True)
class SGEJob:
    """The Grid Engine job this process runs in."""

    job_id: str
    #: The array task, or None outside an array job.
    task_id: str | None
    #: Slots in all (``NSLOTS``).
    slots: int
    #: The parallel environment's hosts and their slots; one entry outside one.
    hosts: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class SGEGrant:
    """This host's share of the job, as Grid Engine states it."""

    cpus: int
    #: Bytes, or None when the job asked for no ``h_vmem``.
    memory: int | None
    #: GPUs granted on this host.
    gpus: int
    #: Their labels, or () when nothing names them.
    gpu_labels: tuple[str, ...]


def in_sge_job(environ: Mapping[str, str]) -> bool:
    return bool(environ.get(JOB_ID, "").strip()) and TASK_ID in environ


def _positive(value: str, name: str) -> int:
    if not re.fullmatch(r"\s*[1-9]\d*\s*", value):
        raise ValueError(f"{name}={value!r}: expected a positive whole number")
    return int(value)


def parse_pe_hostfile(text: str) -> tuple[tuple[str, int], ...]:
    """``PE_HOSTFILE`` lines (``host slots queue processors``) as (host, slots)."""
    hosts = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise ValueError(f"{PE_HOSTFILE}: line {line!r}: expected HOST SLOTS QUEUE ...")
        hosts.append((fields[0], _positive(fields[1], f"{PE_HOSTFILE} slots of {fields[0]}")))
    if not hosts:
        raise ValueError(f"{PE_HOSTFILE} lists no host")
    return tuple(hosts)


def sge_job(environ: Mapping[str, str], hostfile: str | None, hostname: str) -> SGEJob:
    """The job of ``environ``; ``hostfile`` is the text of its ``PE_HOSTFILE`` (None
    outside a parallel environment: the job has this host and ``NSLOTS`` slots)."""
    if not in_sge_job(environ):
        raise NotInSGEJob(
            f"not inside a Grid Engine job ({JOB_ID} and {TASK_ID} are not set): run "
            "from a qsub script, or a qrsh or qlogin session"
        )
    slots = _positive(environ.get(NSLOTS, "1"), NSLOTS)
    hosts = parse_pe_hostfile(hostfile) if hostfile is not None else ((hostname, slots),)
    task = environ.get(TASK_ID, "").strip()
    return SGEJob(
        environ[JOB_ID].strip(),
        None if task in ("", "undefined") else task,
        slots,
        hosts,
    )


def same_host(listed: str, hostname: str) -> bool:
    """Whether a ``PE_HOSTFILE`` name is ``hostname``, by full or short name (Grid
    Engine writes the names it resolved, which may be qualified where ours is not)."""
    return listed == hostname or listed.split(".", 1)[0] == hostname.split(".", 1)[0]


def host_index(job: SGEJob, hostname: str) -> int:
    """This host's line of the ``PE_HOSTFILE`` (0: the master host); a job of one
    host is this host whatever its name."""
    for index, (host, _) in enumerate(job.hosts):
        if same_host(host, hostname):
            return index
    if len(job.hosts) == 1:
        return 0
    names = ", ".join(host for host, _ in job.hosts)
    raise ValueError(f"this host ({hostname}) is not among the job's hosts ({names})")


def host_slots(job: SGEJob, hostname: str) -> int:
    """This host's slots: its ``PE_HOSTFILE`` entry (by full or short name), else all."""
    return job.hosts[host_index(job, hostname)][1]


def parse_resource_list(qstat_j: str) -> dict[str, str]:
    """The ``hard resource_list:`` of ``qstat -j JOB`` as name -> value ({} if none)."""
    found: dict[str, str] = {}
    for line in qstat_j.splitlines():
        head, _, rest = line.partition(":")
        if head.strip() == "hard resource_list":
            for item in rest.strip().split(","):
                name, sep, value = item.partition("=")
                if sep and name.strip():
                    found[name.strip()] = value.strip()
    return found


def parse_complexes(qconf_sc: str) -> dict[str, tuple[str, str]]:
    """``qconf -sc`` as name (and shortcut) -> (name, its ``consumable`` column:
    ``YES`` per slot, ``JOB`` per job, ``NO``, ``FORCED``)."""
    found: dict[str, tuple[str, str]] = {}
    for line in qconf_sc.splitlines():
        fields = line.split()
        if len(fields) >= 6 and not line.lstrip().startswith("#"):
            found[fields[0]] = found[fields[1]] = (fields[0], fields[5].upper())
    return found


def memory_bytes(value: str, name: str) -> int:
    """A Grid Engine memory value (``4G``, ``512M``, ``1.5g``) in bytes."""
    match = _MEMORY.match(value)
    if match is None:
        raise ValueError(f"{name}={value!r}: expected a memory size such as 4G or 512M")
    return int(float(match.group(1)) * _FACTOR[match.group(2)])


def _requested(
    resources: Mapping[str, str], complexes: Mapping[str, tuple[str, str]], name: str
) -> str | None:
    """What the job asked of complex ``name``, by its name or its shortcut; or None."""
    for key, value in resources.items():
        if complexes.get(key, (key, ""))[0] == name:
            return value
    return None


def _gpu_labels(environ: Mapping[str, str], gpu_complex: str, count: int) -> tuple[str, ...]:
    for variable in ("CUDA_VISIBLE_DEVICES", f"SGE_HGR_{gpu_complex}"):
        value = environ.get(variable)
        if value is None:
            continue
        text = value.replace(" ", ",") if variable.startswith("SGE_HGR_") else value
        try:
            labels = tuple(parse_mask(text) or ())
        except ValueError as exc:
            raise ValueError(str(exc).replace("CUDA_VISIBLE_DEVICES", variable, 1)) from None
        if len(labels) != count:
            raise ValueError(
                f"{variable}={value!r} names {len(labels)} device(s), and Grid Engine "
                f"granted {gpu_complex}={count} on this host: give --resources explicitly"
            )
        return labels
    return ()


def sge_grant(
    environ: Mapping[str, str],
    slots: int,
    resources: Mapping[str, str],
    complexes: Mapping[str, tuple[str, str]],
    gpu_complex: str = GPU_COMPLEX,
    *,
    master: bool = True,
) -> SGEGrant:
    """This host's grant: ``slots`` (``host_slots``), the job's hard ``resources``
    (``parse_resource_list``) and the ``complexes`` (``parse_complexes``); ``master``:
    this is the job's master host (``host_index`` 0), where a per-job consumable is."""
    memory = None
    vmem = resources.get("h_vmem")
    if vmem is not None:
        memory = memory_bytes(vmem, "h_vmem") * slots
    gpus = 0
    asked = _requested(resources, complexes, gpu_complex)
    if asked is not None:
        if gpu_complex not in complexes:
            raise ValueError(
                f"the job asked for {gpu_complex}={asked} and qconf -sc lists no complex "
                f"{gpu_complex!r}"
            )
        kind = complexes[gpu_complex][1]
        count = 0 if asked.strip() == "0" else _positive(asked, gpu_complex)
        if kind == "YES":
            gpus = count * slots
        elif kind == "JOB" and not master:
            gpus = 0  # debited from the master queue only
        else:
            gpus = count
    labels = _gpu_labels(environ, gpu_complex, gpus) if gpus else ()
    return SGEGrant(slots, memory, gpus, labels)


def grant_supply(grant: SGEGrant) -> tuple[Amounts, Units]:
    """The pools ``sge`` stands for: ``cpus``, ``memory`` (if granted), ``gpu``
    (``gpu=[...]`` when its devices are named, else a count)."""
    amounts: Amounts = {CPUS: grant.cpus * SCALE}
    units: Units = {}
    if grant.memory is not None:
        amounts[MEMORY] = grant.memory * SCALE
    if grant.gpus:
        amounts[GPU] = grant.gpus * SCALE
        if grant.gpu_labels:
            units[GPU] = list(grant.gpu_labels)
    return amounts, units


def grant_note(grant: SGEGrant, gpu_complex: str = GPU_COMPLEX) -> str | None:
    """What a user should hear about the grant: GPUs counted but not named."""
    if grant.gpus and not grant.gpu_labels:
        return (
            f"Grid Engine granted {gpu_complex}={grant.gpus} without naming the devices "
            "(no CUDA_VISIBLE_DEVICES or SGE_HGR_ variable): offering gpu as a count; "
            "tasks get no CUDA_VISIBLE_DEVICES"
        )
    return None
