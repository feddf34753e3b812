"""Large values on a real cluster: served at their own size, beyond 2 GiB, within a
worker's memory limit."""

from __future__ import annotations

import os
import resource
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import psutil
import pytest

from apportion import Client
from cli_processes import Processes

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

# Workers cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MB = 10**6


def peak_rss() -> int:
    """This process's peak resident memory so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def ones(nbytes: int) -> np.ndarray[Any, Any]:
    return np.ones(nbytes, dtype=np.uint8)


def peak_rss_of(pid: int) -> int:
    """Another process's peak resident memory so far, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def _cluster(procs: Processes, *worker_args: str) -> str:
    address = procs.scheduler()
    procs.start("worker", address, "--nthreads", "1", "--name", "w", *worker_args)
    return address


def test_a_300mb_result_is_served_within_a_1gib_limit_at_its_own_size(
    procs: Processes,
) -> None:
    """Serving a value costs its worker no copy of it: measured as the worker's peak
    memory before and after the value is gathered, directly and through the scheduler."""
    address = _cluster(procs, "--memory-limit", "1GiB")
    with Client(address) as client:
        client.wait_for_workers(1, timeout=30)
        (pid,) = client.run(os.getpid).values()
        future = client.submit(ones, 300 * MB)
        assert future.result().nbytes == 300 * MB  # gathered straight from the worker
        (before,) = client.run(peak_rss).values()
        with Client(address, direct_to_workers=False) as relayed:
            assert relayed.gather(relayed.submit(ones, 300 * MB)).nbytes == 300 * MB
        value = client.gather(future)
        assert value.nbytes == 300 * MB and int(value[-1]) == 1
        (after,) = client.run(peak_rss).values()
        assert list(client.run(os.getpid).values()) == [pid]  # never killed meanwhile
    # The worker's peak covers making the value once; serving it twice adds no copy.
    assert after - before < 0.1 * 300 * MB, (
        f"serving raised the worker's peak by {after - before:,}"
    )


def test_relaying_a_300mb_result_to_5_clients_at_once_costs_the_scheduler_a_bounded_buffer(
    procs: Processes,
) -> None:
    """Clients that cannot reach the worker (``direct_to_workers=False``, as on a login
    node) get large results forwarded through the scheduler, which holds a few MiB of
    each at a time: measured as its peak memory before and after 5 concurrent fetches
    of 300 MB (holding them would take 1.5 GB)."""
    scheduler, address, _ = procs.start_scheduler()
    procs.start("worker", address, "--nthreads", "1", "--name", "w")
    with Client(address) as owner:
        owner.wait_for_workers(1, timeout=30)
        future = owner.submit(ones, 300 * MB, key="big")
        future.result()  # once straight from the worker, to warm every path up
        before = peak_rss_of(scheduler.pid)

        def fetch(_: int) -> int:
            with Client(address, direct_to_workers=False) as relayed:
                value = relayed.gather(relayed.submit(ones, 300 * MB, key="big"))
                return int(value.sum())

        with ThreadPoolExecutor(5) as pool:
            sums = list(pool.map(fetch, range(5)))
        after = peak_rss_of(scheduler.pid)
    assert sums == [300 * MB] * 5
    assert after - before < 64 * 2**20, f"the scheduler's peak rose by {after - before:,}"


@pytest.mark.skipif(
    psutil.virtual_memory().available < 10 * 2**30,
    reason="needs 10 GiB of free memory for a value above 2 GiB on each side",
)
def test_a_value_above_2_gib_travels_from_a_worker_to_the_client(procs: Processes) -> None:
    address = _cluster(procs)
    size = 2 * 2**30 + 4096
    with Client(address) as client:
        client.wait_for_workers(1, timeout=30)
        value = client.submit(ones, size).result(timeout=120)
        assert value.nbytes == size and int(value[0]) == int(value[-1]) == 1
        back = client.submit(lambda a: int(a[::4096].sum()), client.scatter(value))
        assert back.result(timeout=120) == len(range(0, size, 4096))
