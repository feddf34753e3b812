"""Dask's names for looking into a client, on real processes: CLI workers and the
worker processes of ``Client()``, with the blocking and the asynchronous client.

A task recreated here runs in this process, in the calling thread, with inputs
fetched from the worker processes (and computed again there when released).
"""

from __future__ import annotations

import asyncio
import gzip
import os
import sys
from pathlib import Path

import cloudpickle
import msgpack
import pytest

from apportion import Client, LocalCluster, get_worker, wait
from cli_processes import Processes

pytestmark = [pytest.mark.process, pytest.mark.tcp]

# Worker processes are fresh interpreters that cannot import this test module:
# send its functions by value, as functions of a user's script are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def dec(x: int) -> int:
    return x - 1


def div(x: float, y: float) -> float:
    return x / y


def pid_plus(x: int) -> tuple[int, int]:
    return os.getpid(), x + 1


def where_the_scheduler_is() -> str:
    return get_worker().scheduler.address


def test_cli_workers_blocking_client(procs: Processes, tmp_path: Path) -> None:
    address = procs.two_workers()
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        assert client.scheduler.address == address
        for name in ("a", "b"):
            seen = client.submit(where_the_scheduler_is, workers=[name], pure=False)
            assert seen.result(timeout=30) == address
        failed = client.submit(div, 1, client.submit(dec, 1, workers=["a"]), workers=["b"])
        wait(failed, timeout=30)
        with pytest.raises(ZeroDivisionError):
            client.recreate_error_locally(failed)
        ran = client.submit(pid_plus, 1)
        remote_pid, _ = ran.result(timeout=30)
        assert remote_pid != os.getpid()
        assert client.recreate_task_locally(ran) == (os.getpid(), 2)  # here, not there
        assert client.nbytes(summary=False)[ran.key] > 0
        client.dump_cluster_state(tmp_path / "dump")
        with gzip.open(tmp_path / "dump.msgpack.gz") as f:
            assert len(msgpack.unpack(f)["workers"]) == 2


def test_cli_workers_asynchronous_client(procs: Processes) -> None:
    address = procs.two_workers()

    async def main() -> None:
        async with Client(address, asynchronous=True) as client:
            await client.wait_for_workers(2, timeout=30)
            assert client.scheduler.address == address
            seen = client.submit(where_the_scheduler_is, pure=False)
            assert await seen == address
            zero = client.submit(dec, 1)
            failed = client.submit(div, 1, zero)
            await wait(failed)
            with pytest.raises(ZeroDivisionError):
                await client.recreate_error_locally(failed)
            ran = client.submit(pid_plus, 5)
            await ran
            assert await client.recreate_task_locally(ran) == (os.getpid(), 6)
            assert await client.nbytes() == {
                "where_the_scheduler_is": (await client.nbytes(summary=False))[seen.key],
                "dec": 28,
                "pid_plus": (await client.nbytes([ran], summary=False))[ran.key],
            }

    asyncio.run(asyncio.wait_for(main(), 50))


def test_client_of_worker_processes_and_its_cluster_s_sync() -> None:
    with Client(n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        cluster = client.cluster
        assert isinstance(cluster, LocalCluster)
        assert client.scheduler.address == cluster.scheduler.address
        assert client.submit(where_the_scheduler_is).result(timeout=30) == cluster.scheduler_address

        async def workers_there() -> int:
            return len(cluster.scheduler.state.workers)

        assert cluster.sync(workers_there) == 1
        ran = client.submit(pid_plus, 1)
        assert ran.result(timeout=30)[0] != os.getpid()
        assert client.recreate_task_locally(ran) == (os.getpid(), 2)
