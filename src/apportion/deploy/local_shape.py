"""The workers of a ``LocalCluster``: how many, their threads and resources, by
Dask's rules, and the command line that starts one as a process.

Apart from the cluster that starts them (``local.py``), so that the rules are read
and tested on their own; the in-process workers take the same specs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from apportion.core.resources import ResourceSpec, format_resources, parse_supply

#: A local worker that loses its scheduler retries this long, then exits. Long enough to
#: rejoin after being declared lost (a task that held the GIL past the worker timeout),
#: short enough that workers of a process that died do not linger.
LOCAL_RECONNECT_SECONDS = 5.0


def _cpus() -> int:
    return os.cpu_count() or 1


def _default_shape() -> tuple[int, int]:
    cpus = _cpus()
    n_workers = max(1, min(cpus, 4))
    return n_workers, max(1, cpus // n_workers)


def cluster_shape(
    n_workers: int | None, threads_per_worker: int | None, processes: bool
) -> tuple[int, int]:
    """Dask's rules for (workers, threads each) from what was given."""
    cpus = _cpus()
    if n_workers is None and threads_per_worker is None:
        return _default_shape() if processes else (1, cpus)
    if n_workers is None:
        assert threads_per_worker is not None
        return (max(1, cpus // threads_per_worker) if processes else 1), threads_per_worker
    if threads_per_worker is None:
        return n_workers, max(1, -(-cpus // max(1, n_workers)))
    return n_workers, threads_per_worker


def worker_spec(index: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """One worker as described (``nthreads``, ``resources``, ``name``), checked and
    parsed here so that a bad description fails in the caller, not in a worker process."""
    unknown = set(given) - {"nthreads", "resources", "name"}
    if unknown:
        raise ValueError(f"unknown worker settings {sorted(unknown)}")
    nthreads = int(given.get("nthreads") or _default_shape()[1])
    if nthreads < 1:
        raise ValueError(f"nthreads must be at least 1, got {nthreads}")
    # Unit labels are kept, or ``gpu=[0,1]`` would reach the worker as ``gpu=2``.
    amounts, units = parse_supply(given.get("resources"))
    return {
        "name": str(given.get("name") or f"worker-{index}"),
        "nthreads": nthreads,
        "resources": amounts,
        "units": units,
    }


def default_resources() -> ResourceSpec:
    """Dask's ``distributed.worker.resources`` when ``resources=`` is not given, as
    Dask's LocalCluster would; per-worker ``workers=[...]`` shapes are taken as written.
    Dask's configuration is read only if the program imported Dask: never loaded here."""
    from apportion.worker.dask_config import (
        dask_worker_resources,
        log_dask_resources,
        read_dask_config,
    )

    found = dask_worker_resources(os.environ, lambda: read_dask_config(import_dask=False))
    if found is None:
        return None
    log_dask_resources(found, "LocalCluster")
    return found.spec


def worker_command(scheduler_address: str, spec: Mapping[str, Any]) -> list[str]:
    """The command line of one worker process, resources written back as a spec."""
    cmd = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler_address]
    cmd += ["--nthreads", str(spec["nthreads"]), "--name", spec["name"]]
    # Always given, even empty, so a worker never falls back to APPORTION_RESOURCES
    # from the user's environment: a LocalCluster's workers have what its spec says.
    cmd += ["--resources", format_resources(spec["resources"], spec["units"]) or "none"]
    cmd += ["--reconnect-timeout", repr(LOCAL_RECONNECT_SECONDS)]
    return cmd
