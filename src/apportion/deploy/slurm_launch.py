"""``apportion slurm``: a cluster for the length of one command, inside an allocation.

The decisions are in ``slurm_plan``; the order of starting and stopping is
``launch.ClusterLaunch``'s. This module says how Slurm places the workers: one
``srun`` step starts a worker supervisor on every node, and ``scancel
--signal=TERM JOB.STEP`` drains them.

scancel sends SIGTERM to every process of the batch step at once, then SIGKILL
after the cluster's ``KillWait`` (30 s by default): the workers' drain is kept
short (``--drain-timeout``) so that the teardown fits in that time.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from apportion.deploy.launch import ClusterLaunch, Connect, LaunchError, node_address
from apportion.deploy.slurm_plan import (
    LaunchOptions,
    SlurmJob,
    scheduler_host,
    step_to_signal,
    worker_step,
)

logger = logging.getLogger("apportion.deploy")


def node_names(job: SlurmJob) -> list[str]:
    """The job's nodes, one name each (``scontrol`` expands ``node[01-04]``)."""
    if job.nodes == 1 and os.environ.get("SLURMD_NODENAME"):
        return [os.environ["SLURMD_NODENAME"]]
    done = subprocess.run(
        ["scontrol", "show", "hostnames", job.nodelist],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise LaunchError(f"scontrol show hostnames {job.nodelist}: {done.stderr.strip()}")
    return done.stdout.split()


class SlurmLaunch(ClusterLaunch):
    """``ClusterLaunch`` on a Slurm allocation's nodes."""

    label = "apportion slurm"

    def __init__(
        self,
        job: SlurmJob,
        options: LaunchOptions,
        scheduler_file: Path,
        command: Sequence[str],
        connect: Connect,
    ) -> None:
        super().__init__(options, scheduler_file, command, connect)
        self.job = job

    def listen_host(self) -> str:
        return scheduler_host(self.job, node_address())

    def nodes(self) -> list[str]:
        return node_names(self.job)

    def start_workers(self) -> None:
        argv = worker_step([sys.executable], self.job, self.options, self.scheduler_file)
        env = {**os.environ, **self.security.environment("worker")}
        self.workers = [
            subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        ]

    def drain_workers(self) -> None:
        """SIGTERM to every worker supervisor (they drain), then wait for the step to end."""
        if not self.workers or self.workers[0].poll() is not None:
            return
        listed = _run(
            ["squeue", "--steps", "--noheader", "--jobs", self.job.job_id, "--format=%i %j"]
        )
        step = None if listed is None else step_to_signal(listed, self.job)
        if step is None:
            logger.warning("apportion slurm: the workers' step is not listed; stopping srun")
            return
        _run(["scancel", "--signal=TERM", step])
        try:
            self.workers[0].wait(self.options.drain_timeout + 10.0)
        except subprocess.TimeoutExpired:
            logger.warning("apportion slurm: workers still running after their drain")


def _run(argv: list[str]) -> str | None:
    """A Slurm command's output, or None (logged) if it failed: teardown goes on."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("apportion slurm: %s: %s", argv[0], exc)
        return None
    if done.returncode != 0:
        logger.warning("apportion slurm: %s: %s", " ".join(argv), done.stderr.strip())
        return None
    return done.stdout
