"""Asks Grid Engine what this job was granted: the I/O behind ``deploy.sge_env``.

The environment gives the slots; the rest of the grant is the job's hard resource
list, which only ``qstat -j $JOB_ID`` prints, and whether a consumable counts per
slot or per job, which only ``qconf -sc`` says. Both run from inside the job (an
execution host is a submit host on every cluster where jobs submit jobs; where it
is not, the error says so and ``--resources`` can state the pools instead).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from apportion.deploy.sge_env import (
    GPU_COMPLEX,
    JOB_ID,
    PE_HOSTFILE,
    SGEGrant,
    SGEJob,
    host_index,
    parse_complexes,
    parse_resource_list,
    sge_grant,
    sge_job,
)
from apportion.deploy.sge_plan import PESettings, parse_pe

#: Names the GPU consumable when the site calls it something else (``gpus``, ``cuda``).
GPU_COMPLEX_VARIABLE = "APPORTION_SGE_GPU_RESOURCE"

#: Seconds a Grid Engine command may take.
TIMEOUT = 30.0


def _ask(*argv: str) -> str:
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise ValueError(f"{' '.join(argv)}: {text}")
    return done.stdout


def current_job(environ: Mapping[str, str] | None = None) -> SGEJob:
    """The job this process runs in, with its ``PE_HOSTFILE`` read."""
    env = os.environ if environ is None else environ
    hostfile = None
    path = env.get(PE_HOSTFILE, "").strip()
    if path:
        try:
            hostfile = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"{PE_HOSTFILE}={path}: {exc.strerror}") from None
    return sge_job(env, hostfile, socket.gethostname())


def current_grant(environ: Mapping[str, str] | None = None) -> SGEGrant:
    """This host's grant (``NotInSGEJob`` outside a job, ``ValueError`` if Grid Engine
    cannot be asked or answers what cannot be read)."""
    env = os.environ if environ is None else environ
    job = current_job(env)
    index = host_index(job, socket.gethostname())
    slots = job.hosts[index][1]
    resources = parse_resource_list(_ask("qstat", "-j", env[JOB_ID].strip()))
    gpu_complex = env.get(GPU_COMPLEX_VARIABLE, GPU_COMPLEX).strip() or GPU_COMPLEX
    complexes = parse_complexes(_ask("qconf", "-sc")) if resources else {}
    return sge_grant(env, slots, resources, complexes, gpu_complex, master=index == 0)


#: Set in a parallel job to its parallel environment's name.
PE_NAME = "PE"


def current_pe(environ: Mapping[str, str] | None = None) -> PESettings | None:
    """The job's parallel environment's settings (``qconf -sp $PE``); None outside
    one (``ValueError`` if Grid Engine cannot be asked or answers what cannot be read)."""
    env = os.environ if environ is None else environ
    name = env.get(PE_NAME, "").strip()
    if not name:
        return None
    return parse_pe(name, _ask("qconf", "-sp", name))
