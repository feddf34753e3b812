"""What ``--resources auto`` offers: the GPUs, CPUs and memory of this machine.

Theory of operation
-------------------
Parsing is pure and tested on samples: ``parse_nvidia_smi`` reads the CSV that
``nvidia-smi --query-gpu=index,uuid --format=csv,noheader`` prints, ``parse_mask``
reads a ``CUDA_VISIBLE_DEVICES`` value, ``gpu_labels`` combines the two, and
``expand_auto`` puts the detected pools into a spec in place of the word ``auto``.
The probes (``probe_gpus``, ``cpu_count``, ``memory_total``) are thin and never fail:
a machine without ``nvidia-smi``, or where it fails, simply has no GPUs, which is
logged once with the reason rather than raised.

GPU labels are what ``CUDA_VISIBLE_DEVICES`` receives for a task holding those units.
Without a mask they are the device indices. Under a mask (as Slurm sets one) they are
the mask's own entries, indices or UUIDs, so that a task's ``CUDA_VISIBLE_DEVICES``
is always a subset of the worker's: the worker never hands out a device it was not
given, and the entries mean the same to CUDA in the task as in the worker.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apportion.core.resources import (
    SCALE,
    Amounts,
    Units,
    format_resources,
    parse_amount,
    parse_supply,
)

logger = logging.getLogger("apportion.worker")

#: The word in a resource spec that stands for the detected pools.
AUTO = "auto"

#: Names of the detected pools: an indexed ``gpu`` pool and two amount pools.
GPU, CPUS, MEMORY = "gpu", "cpus", "memory"

NVIDIA_SMI = "nvidia-smi"
NVIDIA_SMI_ARGS = ("--query-gpu=index,uuid", "--format=csv,noheader")
#: A wedged driver can make nvidia-smi hang; a worker must start regardless.
NVIDIA_SMI_TIMEOUT = 5.0

_INDEX = re.compile(r"^\d+$")
_NEGATIVE = re.compile(r"^-\d+$")
_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9_.:\-]+$")


@dataclass(frozen=True)
class Gpu:
    """One device as nvidia-smi reports it."""

    index: str
    uuid: str


def parse_nvidia_smi(output: str) -> list[Gpu]:
    """Devices in ``index, uuid`` CSV lines; blank lines are skipped.

    Any other line raises ``ValueError`` quoting it: half-understood output
    ("No devices were found", a driver warning) must not become a wrong pool.

    >>> parse_nvidia_smi("0, GPU-aaa\\n1, GPU-bbb\\n")
    [Gpu(index='0', uuid='GPU-aaa'), Gpu(index='1', uuid='GPU-bbb')]
    """
    gpus: list[Gpu] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 2 or not _INDEX.match(fields[0]) or not _UUID.match(fields[1]):
            raise ValueError(f"unexpected line {line.strip()!r}")
        gpus.append(Gpu(fields[0], fields[1]))
    return gpus


def parse_mask(value: str | None) -> list[str] | None:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value leaves visible, in its order.

    None when the variable is unset (no mask: every device is visible). ``""`` and
    ``-1`` hide every device. As CUDA does, entries after the first negative index
    are ignored (``"0,-1,2"`` is device 0 only). An entry listed twice, or one that
    is neither an index nor a UUID, raises ``ValueError``.
    """
    if value is None:
        return None
    entries: list[str] = []
    if not value.strip():
        return entries
    for raw in value.split(","):
        entry = raw.strip()
        if _NEGATIVE.match(entry):
            break
        if not (_INDEX.match(entry) or _UUID.match(entry)):
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} is not a device index or UUID"
            )
        if entry in entries:
            raise ValueError(f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} is listed twice")
        entries.append(entry)
    return entries


def _matches(entry: str, gpu: Gpu) -> bool:
    # CUDA accepts a unique prefix of a UUID as well as the whole of it.
    return entry == gpu.index or (entry.startswith("GPU-") and gpu.uuid.startswith(entry))


def gpu_labels(gpus: Sequence[Gpu], mask: list[str] | None) -> tuple[list[str], list[str]]:
    """Labels of the ``gpu`` pool, and the mask entries that match no device found.

    No devices found means no pool, whatever the mask says. Otherwise a mask gives
    exactly its entries, as written; entries that name no device nvidia-smi reports
    are still offered (the mask is what CUDA will use) but returned for a warning.
    MIG instances are not listed by ``--query-gpu``, so they are never reported.
    """
    if not gpus:
        return [], []
    if mask is None:
        return [gpu.index for gpu in gpus], []
    unknown = [
        entry
        for entry in mask
        if not entry.startswith("MIG-") and not any(_matches(entry, gpu) for gpu in gpus)
    ]
    return list(mask), unknown


def detected_supply(gpus: Sequence[str], cpus: int, memory: int) -> tuple[Amounts, Units]:
    """The pools ``auto`` stands for: ``gpu=[...]`` (if any), ``cpus=N``, ``memory=BYTES``."""
    amounts: Amounts = {CPUS: cpus * SCALE, MEMORY: memory * SCALE}
    units: Units = {}
    if gpus:
        units[GPU] = list(gpus)
        amounts[GPU] = len(gpus) * SCALE
    return amounts, units


def split_auto(spec: str) -> tuple[bool, str]:
    """Whether ``spec`` contains the word ``auto``, and the spec without it.

    ``auto`` is a part of its own, separated by spaces or commas; text inside
    brackets (unit labels) is left alone. ``auto`` given twice is a ``ValueError``:
    it says nothing more than once, so it is a slip (a pasted spec, say).
    """
    return split_word(spec, AUTO)


def split_word(spec: str, keyword: str) -> tuple[bool, str]:
    """``split_auto`` for any word that stands for detected pools (``slurm`` too)."""
    found = False
    kept: list[str] = []
    depth = 0
    word: list[str] = []

    def flush() -> None:
        nonlocal found
        text = "".join(word)
        if text == keyword:
            if found:
                raise ValueError(f"{keyword!r} is given twice in {spec!r}")
            found = True
        else:
            kept.append(text)
        word.clear()

    for char in spec:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth <= 0 and char in " \t\n,":
            flush()
            kept.append(char)
        else:
            word.append(char)
    flush()
    return found, "".join(kept).strip(" \t\n,")


def expand_auto(spec: str, detected: tuple[Amounts, Units], keyword: str = AUTO) -> str:
    """``spec`` with ``auto`` (or ``keyword``) replaced by the detected pools, as an
    explicit spec.

    Pools written in ``spec`` win over detected ones of the same name, so
    ``"auto memory=16GiB"`` caps the memory offered. Raises ``ValueError`` for a
    malformed remainder, as ``parse_supply`` does.
    """
    _, rest = split_word(spec, keyword)
    amounts, units = parse_supply(rest)
    merged_amounts = {**detected[0], **amounts}
    merged_units = {name: labels for name, labels in detected[1].items() if name not in amounts}
    merged_units.update(units)
    return format_resources(merged_amounts, merged_units)


# --- probes: thin, and never raise --------------------------------------------------


def probe_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """Labels of the GPUs this process may use (see ``gpu_labels``); [] if none.

    ``environ`` (default ``os.environ``) supplies ``PATH`` and ``CUDA_VISIBLE_DEVICES``.
    A bad ``CUDA_VISIBLE_DEVICES`` raises ``ValueError``: it is the user's setting.
    """
    env = os.environ if environ is None else environ
    mask = parse_mask(env.get("CUDA_VISIBLE_DEVICES"))
    if mask == []:
        logger.info(
            "no GPUs offered: CUDA_VISIBLE_DEVICES=%r hides every device",
            env["CUDA_VISIBLE_DEVICES"],
        )
        return []
    gpus = _run_nvidia_smi(env.get("PATH", os.defpath))
    labels, unknown = gpu_labels(gpus, mask)
    if unknown:
        logger.warning(
            "CUDA_VISIBLE_DEVICES names %s, which nvidia-smi does not report; offered anyway",
            ",".join(unknown),
        )
    return labels


def _run_nvidia_smi(path: str) -> list[Gpu]:
    binary = shutil.which(NVIDIA_SMI, path=path)
    if binary is None:
        logger.info("no GPUs detected: %s is not on PATH", NVIDIA_SMI)
        return []
    try:
        done = subprocess.run(
            [binary, *NVIDIA_SMI_ARGS],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        logger.warning("no GPUs detected: %s took over %gs", binary, NVIDIA_SMI_TIMEOUT)
        return []
    except OSError as exc:
        logger.warning("no GPUs detected: %s could not run: %s", binary, exc)
        return []
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        logger.info(
            "no GPUs detected: %s exited with status %d%s",
            binary,
            done.returncode,
            f" ({said[0]})" if said else "",
        )
        return []
    try:
        gpus = parse_nvidia_smi(done.stdout)
    except ValueError as exc:
        logger.warning("no GPUs detected: output of %s not understood: %s", binary, exc)
        return []
    if not gpus:
        logger.info("no GPUs detected: %s lists no devices", binary)
    return gpus


def cpu_count() -> int:
    """Logical CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def memory_total() -> int:
    """Physical memory of the machine in bytes."""
    import psutil

    return int(psutil.virtual_memory().total)


def detect_supply(environ: Mapping[str, str] | None = None) -> tuple[Amounts, Units]:
    """Run every probe: what ``auto`` stands for on this machine, in this environment."""
    return detected_supply(probe_gpus(environ), cpu_count(), memory_total())


def parse_memory_limit(text: str, nworkers: int, total: int | None = None) -> int:
    """``--memory-limit``: bytes for each worker process, 0 for none.

    ``4GiB`` or ``4e9`` (a size), ``0.5`` (a fraction of the machine's memory, for each
    process), ``auto`` (the machine's memory shared among the ``nworkers`` processes),
    ``0`` or ``none`` (no limit). Raises ``ValueError`` with the accepted forms.
    """
    value = text.strip().lower()
    if value in ("", "0", "none"):
        return 0
    machine = memory_total() if total is None else total
    if value == "auto":
        return machine // nworkers
    try:
        amount = parse_amount(value, name="memory-limit") / SCALE
    except ValueError:
        raise ValueError(
            f"--memory-limit {text!r}: use a size (4GiB, 4e9), a fraction of the "
            "machine's memory (0.5), auto or none"
        ) from None
    limit = int(amount * machine) if amount <= 1 else int(amount)
    if limit < 2**20:
        raise ValueError(f"--memory-limit {text!r} is below 1 MiB: no worker can run in that")
    return limit
