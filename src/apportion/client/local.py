"""An embedded cluster on this machine: the default that needs no set-up.

The scheduler runs on a background thread of this process. Workers are separate
processes started as fresh interpreters running apportion's own worker entry point
(``python -m apportion.cli.main worker``), never forks or spawns of the user's
``__main__``: a script without an ``if __name__ == "__main__":`` guard works, and
functions defined in it travel by value.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from apportion.cli.logs import LEVEL_VARIABLE
from apportion.client import session
from apportion.core.resources import ResourceSpec, format_resources, parse_supply
from apportion.loop_thread import LoopThread
from apportion.scheduler.service import Scheduler
from apportion.scheduler.state import SchedulerConfig

#: A local worker that loses its scheduler retries this long, then exits. Long enough to
#: rejoin after being declared lost (a task that held the GIL past the worker timeout),
#: short enough that workers of a process that died do not linger.
LOCAL_RECONNECT_SECONDS = 5.0


#: Clusters not closed yet: closed at interpreter exit (see ``_close_at_exit``).
_open_clusters: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close what a script left open, clients first, as Dask does at exit.

    Left alone, the loop thread is frozen at exit with its tasks pending ("Task was
    destroyed but it is pending!", unclosed sockets). Clients go first so that none
    sees its scheduler vanish and reports it as a lost connection.
    """
    session.close_all()
    for cluster in list(_open_clusters):
        with contextlib.suppress(Exception):
            cluster.close()


def _default_shape() -> tuple[int, int]:
    cpus = os.cpu_count() or 1
    n_workers = max(1, min(cpus, 4))
    return n_workers, max(1, cpus // n_workers)


class LocalCluster:
    """A scheduler and workers on this machine.

    ``LocalCluster(n_workers=2, threads_per_worker=1, resources="GPU=2")`` gives every
    worker the same shape; ``workers=[{"nthreads": 4, "resources": {"GPU": 2}}, ...]``
    describes each worker. A local cluster cannot grow, so a task asking for more
    than any worker offers fails at once with ``UnsatisfiableError``.
    """

    def __init__(
        self,
        n_workers: int | None = None,
        threads_per_worker: int | None = None,
        resources: ResourceSpec = None,
        *,
        processes: bool = True,
        workers: Sequence[Mapping[str, Any]] | None = None,
        host: str = "127.0.0.1",
        scheduler_port: int = 0,
        timeout: float = 60.0,
    ) -> None:
        default_n, default_threads = _default_shape()
        if workers is None:
            count = default_n if n_workers is None else n_workers
            resources = _default_resources() if resources is None else resources
            workers = [
                {"nthreads": threads_per_worker or default_threads, "resources": resources}
            ] * count
        self.specs = [self._spec(i, w) for i, w in enumerate(workers)]
        self.processes = processes
        self._loop = LoopThread("apportion-cluster")
        self.scheduler = Scheduler(
            host, scheduler_port, config=SchedulerConfig(fail_unsatisfiable=True)
        )
        self._procs: list[subprocess.Popen[bytes]] = []
        self._workers: list[Any] = []
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_processes, self._procs)
        _open_clusters.add(self)
        try:
            self._loop.run(self.scheduler.start())
            self.scheduler_address = self.scheduler.address
            if processes:
                self._start_processes(timeout)
            else:
                self._loop.run(self._start_in_process())
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _spec(index: int, given: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(given) - {"nthreads", "resources", "name"}
        if unknown:
            raise ValueError(f"unknown worker settings {sorted(unknown)}")
        nthreads = int(given.get("nthreads") or _default_shape()[1])
        if nthreads < 1:
            raise ValueError(f"nthreads must be at least 1, got {nthreads}")
        # Parsed here so a bad spec fails in the caller, not in a worker process;
        # unit labels are kept, or ``gpu=[0,1]`` would reach the worker as ``gpu=2``.
        amounts, units = parse_supply(given.get("resources"))
        return {
            "name": str(given.get("name") or f"worker-{index}"),
            "nthreads": nthreads,
            "resources": amounts,
            "units": units,
        }

    def _start_processes(self, timeout: float) -> None:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault(LEVEL_VARIABLE, "WARNING")
        for spec in self.specs:
            cmd = worker_command(self.scheduler_address, spec)
            self._procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))
        self._wait_for_workers(timeout)

    def _wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.scheduler.state.workers) < len(self.specs):
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"a worker process exited with status {proc.returncode} while starting"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers did not connect within {timeout}s")
            time.sleep(0.02)

    async def _start_in_process(self) -> None:
        from apportion.worker.service import Worker

        for spec in self.specs:
            worker = Worker(
                self.scheduler_address,
                nthreads=spec["nthreads"],
                resources=format_resources(spec["resources"], spec["units"]),
                name=spec["name"],
                reconnect_timeout=LOCAL_RECONNECT_SECONDS,
            )
            await worker.start()
            self._workers.append(worker)

    @property
    def workers(self) -> list[dict[str, Any]]:
        """The worker shapes this cluster was asked for."""
        return list(self.specs)

    def close(self) -> None:
        """Stop workers (TERM, then KILL after a grace period) and the scheduler."""
        if self._closed:
            return
        self._closed = True

        async def stop_in_process() -> None:
            for worker in self._workers:
                with contextlib.suppress(Exception):
                    await worker.close()
            await self.scheduler.close()

        _stop_processes(self._procs)
        with contextlib.suppress(Exception):
            self._loop.run(stop_in_process(), timeout=15)
        self._loop.stop()
        self._finalizer.detach()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "processes" if self.processes else "in-process"
        return f"<LocalCluster {self.scheduler_address}: {len(self.specs)} workers ({kind})>"


def _default_resources() -> ResourceSpec:
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


def _stop_processes(procs: list[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
