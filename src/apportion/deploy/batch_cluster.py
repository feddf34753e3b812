"""A scheduler in this process and worker jobs through a batch system, sized by the work.

What ``SlurmCluster`` and ``SGECluster`` share: the scheduler runs on a thread of
this process, listening where the compute nodes can reach it (this host's address
unless ``host`` is given), with TLS and a fresh secret unless it listens on
loopback. Jobs find it through a scheduler file in the log directory (mode 0600; the
directory should be on a file system the nodes share, as the working directory of a
job usually is). The one pure ``Allocator`` decides which jobs to ask for
(``deploy.allocator``); a ``Batch`` (``SlurmBatch``, ``SGEBatch``) carries that out
in the batch system's own commands.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from apportion.core.durations import Duration, seconds
from apportion.deploy.adaptive import Adaptive, Batch, Observation, credential_files
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

#: Makes the batch system's adapter for these templates, scheduler file and TLS files.
MakeBatch = Callable[[Sequence[JobTemplate], str, dict[str, str]], Batch]


def reachable_host() -> str:
    """This host's address as the other nodes resolve its name."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class BatchCluster:
    """A scheduler on this host and worker jobs of ``templates`` through ``make_batch``;
    ``SlurmCluster`` and ``SGECluster`` say which templates and which batch system."""

    def __init__(
        self,
        templates: Sequence[JobTemplate],
        make_batch: MakeBatch,
        log_directory: Path,
        *,
        host: str | None,
        scheduler_port: int,
        security: Security | None,
        n_workers: int,
        interval: float,
    ) -> None:
        kinds = {type(t).__name__: t.GRANT for t in templates}
        if len(set(kinds.values())) > 1:
            raise TypeError(
                f"{type(self).__name__}: templates of one batch system only, got "
                f"{', '.join(sorted(kinds))}"
            )
        self.log_directory = log_directory
        self.templates = list(templates)
        self.allocator = Allocator([t.shape() for t in self.templates])
        host = host or reachable_host()
        if security is None:
            # Across nodes nothing travels in the clear; on loopback a secret is enough.
            security = Security.in_memory() if is_loopback(host) else Security.temporary()
        self.security = security
        self.scheduler = Scheduler(
            host, scheduler_port, config=SchedulerConfig(), security=security
        )
        self._loop = LoopThread(f"apportion-{type(self).__name__}")
        self._files: list[Path] = []
        self._closed = False
        try:
            self._loop.run(self.scheduler.start())
            self.scheduler_address = self.scheduler.address
            self.scheduler_file = self._write_files()
            batch = make_batch(self.templates, str(self.scheduler_file), self._tls)
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        shapes = ", ".join(t.shape().describe() for t in self.templates)
        return f"{type(self).__name__}({self.scheduler_address!r}, jobs: {shapes})"
