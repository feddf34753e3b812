"""``apportion sge``: a cluster for the length of one command, inside a Grid Engine job.

The decisions are in ``sge_plan``; the order of starting and stopping is
``launch.ClusterLaunch``'s. Here: the scheduler on loopback and one worker
supervisor on this host, both in the job's process group with SIGUSR2 ignored;
``-notify``'s SIGUSR2 (before ``qdel``'s SIGKILL) stops the cluster as SIGTERM does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from apportion.deploy.launch import ClusterLaunch, Connect
from apportion.deploy.sge_env import SGEJob
from apportion.deploy.sge_plan import ignoring_notify, worker_command
from apportion.deploy.slurm_plan import LOOPBACK, LaunchOptions

logger = logging.getLogger("apportion.deploy")


class SGELaunch(ClusterLaunch):
    """``ClusterLaunch`` on this host of a Grid Engine job."""

    label = "apportion sge"
    stop_signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
    own_session = False

    def __init__(
        self,
        job: SGEJob,
        options: LaunchOptions,
        scheduler_file: Path,
        command: Sequence[str],
        connect: Connect,
    ) -> None:
        super().__init__(options, scheduler_file, command, connect)
        self.job = job
        self.host = socket.gethostname()

    def wrap(self, argv: list[str]) -> list[str]:
        return ignoring_notify(argv)

    def listen_host(self) -> str:
        return LOOPBACK  # one host: nothing else needs to reach it

    def nodes(self) -> list[str]:
        return [self.host]

    def start_workers(self) -> None:
        argv = worker_command([sys.executable], self.options, self.scheduler_file, self.host)
        env = {**os.environ, **self.security.environment("worker")}
        self.workers = subprocess.Popen(self.wrap(argv), env=env, stdin=subprocess.DEVNULL)

    def drain_workers(self) -> None:
        """SIGTERM to the supervisor (its workers drain), then wait for it."""
        if self.workers is None or self.workers.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.workers.send_signal(signal.SIGTERM)
        try:
            self.workers.wait(self.options.drain_timeout + 10.0)
        except subprocess.TimeoutExpired:
            logger.warning("apportion sge: workers still running after their drain")
