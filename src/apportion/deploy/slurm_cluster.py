"""``SlurmCluster``: a scheduler here, worker jobs through ``sbatch``, sized by the work.

In dask-jobqueue's words: ``SlurmCluster(cores=8, memory="32GiB", walltime="02:00:00")``
describes one worker job; ``cluster.scale(4)`` asks for four workers, and
``cluster.adapt(minimum=0, maximum=20)`` lets the work decide. Unlike a load-only
adaptive cluster it asks for a job only of a shape the waiting work fits: with
``gpus=1`` and a second template for CPU work (``templates=[JobTemplate(...)]``),
GPU tasks bring GPU jobs and nothing else does (``deploy.allocator``).

The scheduler runs on a thread of this process, listening where the compute nodes
can reach it (this host's address unless ``host`` is given), with TLS and a fresh
secret unless it listens on loopback. Jobs find it through a scheduler file in the
log directory (mode 0600; the directory should be on a file system the nodes
share, as the working directory of a job usually is).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from apportion.core.durations import Duration, seconds
from apportion.deploy.adaptive import Adaptive, Observation, SlurmBatch, credential_files
from apportion.deploy.allocator import Allocator, Policy
from apportion.deploy.job_template import JobTemplate
from apportion.home import private_dir
from apportion.loop_thread import LoopThread
from apportion.net.address import is_loopback
from apportion.net.scheduler_file import remove_scheduler_file, write_scheduler_file
from apportion.net.security import Security
from apportion.scheduler.backlog import backlog
from apportion.scheduler.service import Scheduler
from apportion.scheduler.state import SchedulerConfig

logger = logging.getLogger("apportion.deploy")


def reachable_host() -> str:
    """This host's address as the other nodes resolve its name."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class SlurmCluster:
    """A scheduler on this host and worker jobs submitted with ``sbatch``.

    The keyword arguments describe the default job (``JobTemplate``: ``cores``,
    ``memory``, ``processes``, ``gpus``, ``resources``, ``walltime``, ``queue``,
    ``account``, ``job_extra_directives`` (or ``job_extra``), ``job_script_prologue``,
    ``worker_extra_args``, ``python``); ``templates`` adds other kinds of job.
    """

    def __init__(
        self,
        cores: int = 1,
        memory: str | None = None,
        processes: int = 1,
        *,
        gpus: int = 0,
        resources: str = "",
        walltime: str = "01:00:00",
        queue: str | None = None,
        account: str | None = None,
        job_extra_directives: Sequence[str] = (),
        job_extra: Sequence[str] | None = None,
        job_script_prologue: Sequence[str] = (),
        worker_extra_args: Sequence[str] = (),
        python: str = sys.executable,
        name: str = "default",
        templates: Sequence[JobTemplate] = (),
        log_directory: str | os.PathLike[str] = "apportion-slurm",
        host: str | None = None,
        scheduler_port: int = 0,
        security: Security | None = None,
        n_workers: int = 0,
        interval: float = 2.0,
    ) -> None:
        self.log_directory = Path(log_directory).absolute()
        default = JobTemplate(
            name=name,
            cores=cores,
            memory=memory,
            processes=processes,
            gpus=gpus,
            resources=resources,
            walltime=walltime,
            queue=queue,
            account=account,
            job_extra_directives=[*job_extra_directives, *(job_extra or ())],
            job_script_prologue=job_script_prologue,
            python=python,
            worker_extra_args=worker_extra_args,
            log_directory=str(self.log_directory),
        )
        own = str(self.log_directory)
        self.templates = [default] + [
            t if t.log_directory else dataclasses.replace(t, log_directory=own) for t in templates
        ]
        self.allocator = Allocator([t.shape() for t in self.templates])
        host = host or reachable_host()
        if security is None:
            # Across nodes nothing travels in the clear; on loopback a secret is enough.
            security = Security.in_memory() if is_loopback(host) else Security.temporary()
        self.security = security
        self.scheduler = Scheduler(
            host, scheduler_port, config=SchedulerConfig(), security=security
        )
        self._loop = LoopThread("apportion-slurm")
        self._files: list[Path] = []
        self._closed = False
        try:
            self._loop.run(self.scheduler.start())
            self.scheduler_address = self.scheduler.address
            self.scheduler_file = self._write_files()
            batch = SlurmBatch(self.templates, str(self.scheduler_file), tls_files=self._tls)
            self.adaptive = Adaptive(self.allocator, batch, self._observe, interval=interval)
            self._loop.run(self._start_adaptive())
        except BaseException:
            self.close()
            raise
        if n_workers:
            self.scale(n_workers)

    async def _start_adaptive(self) -> None:
        self.adaptive.start()

    async def _observe(self) -> Observation:
        return backlog(self.scheduler.state)  # on the scheduler's own loop

    def _write_files(self) -> Path:
        directory = private_dir(self.log_directory / ".apportion")
        path = directory / f"scheduler-{self.scheduler.id}.json"
        assert self.security.token is not None
        write_scheduler_file(path, self.scheduler_address, self.security.token, self.scheduler.id)
        self._files.append(path)
        self._tls, written = credential_files(self.security, directory, self.scheduler.id)
        self._files += written
        return path

    # --- what users call --------------------------------------------------------------

    def job_script(self, template: str | None = None) -> str:
        """The batch script of the default job (or of ``template``), as submitted."""
        return self.adaptive.batch.script(template or self.templates[0].name)

    def scale(self, n: int | None = None, jobs: int = 0) -> None:
        """Ask for ``n`` workers (or ``jobs`` jobs) of the default job; returns at once,
        as dask-jobqueue's does (``wait_for_workers`` waits). Stops adapting."""
        count = n if n is not None else jobs * self.templates[0].processes
        self._loop.run(self._decide(lambda: self.allocator.scale(count)))

    def adapt(
        self,
        minimum: int = 0,
        maximum: int = 1_000_000,
        *,
        minimum_jobs: int | None = None,
        maximum_jobs: int | None = None,
        idle_timeout: Duration = 300.0,
        backlog: int = 1,
        max_failures: int = 3,
        pause: Duration = 300.0,
    ) -> None:
        """Follow the waiting work between ``minimum`` and ``maximum`` workers (or
        ``minimum_jobs``/``maximum_jobs`` jobs of the default template)."""
        per_job = self.templates[0].processes
        policy = Policy(
            minimum=minimum if minimum_jobs is None else minimum_jobs * per_job,
            maximum=maximum if maximum_jobs is None else maximum_jobs * per_job,
            backlog=backlog,
            idle_timeout=seconds(idle_timeout, "idle_timeout") or 0.0,
            max_failures=max_failures,
            pause=seconds(pause, "pause") or 0.0,
        )
        self._loop.run(self._decide(lambda: self.allocator.adapt(policy)))

    async def _decide(self, change: Any) -> None:
        change()
        self.adaptive.wake()

    @property
    def reports(self) -> list[str]:
        """What the allocator told the user (work no job fits, failures, pauses)."""
        return list(self.adaptive.reports)

    def status(self) -> dict[str, object]:
        """Jobs and their states, the pause and the unsatisfiable work, as plain data."""
        return self._loop.run(self._status())

    async def _status(self) -> dict[str, object]:
        return self.allocator.status(time.monotonic())

    def wait_for_workers(self, n_workers: int = 1, timeout: Duration | None = None) -> None:
        limit = seconds(timeout, "timeout") if timeout is not None else None
        deadline = None if limit is None else time.monotonic() + limit
        while len(self.scheduler.state.workers) < n_workers:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(self.scheduler.state.workers)} of {n_workers} workers "
                    f"connected within {limit:g} s; {self.status()}"
                )
            time.sleep(0.2)

    def close(self, timeout: Duration = 30.0) -> None:
        """Cancel every job of this cluster, stop the scheduler, remove its files."""
        if self._closed:
            return
        limit = seconds(timeout, "close timeout")
        self._closed = True
        adaptive = getattr(self, "adaptive", None)
        with contextlib.suppress(Exception):
            if adaptive is not None:
                self._loop.run(adaptive.stop(cancel_jobs=True), limit)
            self._loop.run(self.scheduler.close(), limit)
        for path in self._files:
            if path.name.startswith("scheduler-"):
                remove_scheduler_file(path, self.scheduler.id)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        self._loop.stop()

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        shapes = ", ".join(t.shape().describe() for t in self.templates)
        return f"SlurmCluster({self.scheduler_address!r}, jobs: {shapes})"
