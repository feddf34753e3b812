"""``apportion sge``: a cluster for the length of one command, inside a Grid Engine job.

The decisions are in ``sge_plan`` (which host starts how, the command lines); the
order of starting and stopping is ``launch.ClusterLaunch``'s. Here: the scheduler
and each host's start, all in the job's process group with SIGUSR2 ignored;
``-notify``'s SIGUSR2 (before ``qdel``'s SIGKILL) stops the cluster as SIGTERM does.

A supervisor started here is drained with SIGTERM; one started through ``qrsh
-inherit`` by closing the pipe that is its qrsh's standard input
(``sge_task``). The workers qrsh starts read their credentials from the scheduler
file, which gets the cluster's TLS credentials once the scheduler has written it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from apportion.deploy.launch import ClusterLaunch, Connect, LaunchError, node_address
from apportion.deploy.sge_env import SGEJob
from apportion.deploy.sge_plan import WorkerPlan, ignoring_notify, qrsh_environment
from apportion.deploy.slurm_plan import LOOPBACK, LaunchOptions
from apportion.net import security as sec
from apportion.net.scheduler_file import read_scheduler_file, write_scheduler_file

logger = logging.getLogger("apportion.deploy")

#: The variables that carry credentials: never handed to ``qrsh -inherit -V``.
CREDENTIALS = (sec.TOKEN_ENV, sec.TOKEN_FILE_ENV, sec.TLS_CERT_ENV, sec.TLS_KEY_ENV, sec.TLS_CA_ENV)


class SGELaunch(ClusterLaunch):
    """``ClusterLaunch`` on the hosts of a Grid Engine job."""

    label = "apportion sge"
    stop_signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
    own_session = False

    def __init__(
        self,
        job: SGEJob,
        plan: WorkerPlan,
        options: LaunchOptions,
        scheduler_file: Path,
        command: Sequence[str],
        connect: Connect,
    ) -> None:
        super().__init__(options, scheduler_file, command, connect)
        self.job = job
        self.plan = plan

    def wrap(self, argv: list[str]) -> list[str]:
        return ignoring_notify(argv)

    def listen_host(self) -> str:
        # One host: nothing else needs to reach it.
        return node_address() if self.plan.several_hosts else LOOPBACK

    def nodes(self) -> list[str]:
        return [start.host for start in self.plan.starts]

    def start_scheduler(self) -> None:
        super().start_scheduler()
        if self.plan.through_qrsh:
            self._add_tls_to_scheduler_file()

    def _add_tls_to_scheduler_file(self) -> None:
        """The scheduler file, completed with the TLS credentials the workers started
        through qrsh need (they get no credential in their environment)."""
        found = read_scheduler_file(self.scheduler_file)
        if found.token is None:
            raise LaunchError(f"the scheduler file {self.scheduler_file} has no secret")
        cert, key = self.security.cert_for("worker")
        write_scheduler_file(
            self.scheduler_file,
            found.address,
            found.token,
            found.id,
            tls_ca=self.security.tls_ca_file,
            tls_cert=cert,
            tls_key=key,
            dashboard=found.dashboard,
            pid=found.pid,
        )

    def start_workers(self) -> None:
        if self.plan.warning is not None:
            logger.warning("%s: %s", self.label, self.plan.warning)
        for start in self.plan.starts:
            if start.qrsh:
                env = qrsh_environment(os.environ, CREDENTIALS)
                stdin = subprocess.PIPE  # the drain: closed, the task drains
                logger.info("%s: workers on %s through qrsh -inherit", self.label, start.host)
            else:
                env = {**os.environ, **self.security.environment("worker")}
                stdin = subprocess.DEVNULL
            try:
                proc = subprocess.Popen(list(start.argv), env=env, stdin=stdin)
            except OSError as exc:
                raise LaunchError(f"cannot start the workers of {start.host}: {exc}") from None
            self.workers.append(proc)

    def exit_text(self, index: int, status: int) -> str:
        start = self.plan.starts[index]
        if not start.qrsh:
            return f"the workers of {start.host} exited with status {status} before registering"
        return (
            f"qrsh -inherit {start.host} exited with status {status} before its workers "
            "registered (its message is above): a parallel environment whose tasks "
            "Grid Engine starts needs control_slaves TRUE, and a free slot on that host"
        )

    def drain_workers(self) -> None:
        """Each host's supervisor drains (SIGTERM here, EOF through qrsh); wait for all."""
        for start, proc in zip(self.plan.starts, self.workers, strict=False):
            with contextlib.suppress(OSError):
                if start.qrsh and proc.stdin is not None:
                    proc.stdin.close()
                elif proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.options.drain_timeout + 10.0
        for proc in self.workers:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s: workers still running after their drain", self.label)
