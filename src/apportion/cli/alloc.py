"""``apportion alloc slurm``: grow a running cluster with Slurm jobs as its work needs.

It runs beside a scheduler (on the login node, say, in ``tmux``), asks it every few
seconds what is waiting, and submits worker jobs of one shape with ``sbatch`` when
waiting work fits that shape and cannot start, cancelling them when idle
(``deploy.allocator``). The jobs find the scheduler through ``--scheduler-file``,
which must be on a file system the compute nodes share. On exit it cancels the
jobs it submitted, unless ``--keep-jobs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from apportion.cli.credentials import (
    scheduler_address,
    scheduler_file_option,
    scheduler_file_path,
)
from apportion.cli.log_options import announce, log_format_option
from apportion.cli.worker import check_resources
from apportion.log_setup import configure_logging
from apportion.net.security import AuthenticationError, Security

if TYPE_CHECKING:
    from apportion.deploy.adaptive import SlurmBatch
    from apportion.deploy.allocator import Allocator

logger = logging.getLogger("apportion.deploy")


@click.group("alloc")
def alloc() -> None:
    """Grow a running cluster through a batch system as its waiting work needs."""


@alloc.command("slurm", context_settings={"ignore_unknown_options": True})
@scheduler_file_option
@click.option(
    "--cores",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="CPUs per job (--cpus-per-task); threads are split among --processes.",
)
@click.option("--memory", help="Memory per job (16GiB); none: Slurm's default.")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes per job.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="GPUs per job (--gres=gpu:N); tasks see only those Slurm granted.",
)
@click.option(
    "--resources",
    callback=check_resources,
    help='Pools of your own each worker offers besides cpus, memory and GPUs ("licence=2").',
)
@click.option(
    "--walltime",
    default="01:00:00",
    show_default=True,
    help="Time limit of each job; its workers drain a minute before it.",
)
@click.option("--partition", "queue", help="Slurm partition (--partition).")
@click.option("--account", help="Slurm account (--account).")
@click.option(
    "--prologue",
    multiple=True,
    metavar="LINE",
    help="A line the job runs before the worker (module load ...); repeatable.",
)
@click.option(
    "--python",
    default=sys.executable,
    show_default=True,
    help="The Python with apportion installed, on the compute nodes.",
)
@click.option(
    "--log-directory",
    type=click.Path(file_okay=False),
    default="apportion-slurm",
    show_default=True,
    help="Where job scripts and job output go.",
)
@click.option("--min-workers", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--max-workers", type=click.IntRange(min=0), default=100, show_default=True)
@click.option(
    "--backlog",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Jobs waiting in Slurm's queue at most.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="Cancel a job whose workers were all idle this long.",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Failed submissions in a row before pausing.",
)
@click.option(
    "--pause",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to pause submitting after repeated failures.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="How often to look at the waiting work.",
)
@click.option("--keep-jobs", is_flag=True, help="Leave the jobs running on exit.")
@click.option("--dry-run", is_flag=True, help="Print the batch script and exit.")
@log_format_option
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def slurm(
    ctx: click.Context,
    cores: int,
    memory: str | None,
    processes: int,
    gpus: int,
    resources: str | None,
    walltime: str,
    queue: str | None,
    account: str | None,
    prologue: tuple[str, ...],
    python: str,
    log_directory: str,
    min_workers: int,
    max_workers: int,
    backlog: int,
    idle_timeout: float,
    max_failures: int,
    pause: float,
    interval: float,
    keep_jobs: bool,
    dry_run: bool,
    log_format: str,
    sbatch_args: tuple[str, ...],
) -> None:
    """Submit worker jobs with sbatch while waiting work fits them; cancel idle ones.

    Arguments after -- are added to every job as #SBATCH directives:

    \b
      apportion alloc slurm --scheduler-file ~/scheduler.json --cores 8 \\
          --memory 32GiB --gpus 1 --max-workers 4 -- --constraint=a100
    """
    from apportion.deploy.adaptive import SlurmBatch, credential_files
    from apportion.deploy.allocator import Allocator, Policy
    from apportion.deploy.job_template import JobTemplate
    from apportion.home import private_dir

    configure_logging("alloc", log_format)
    file = scheduler_file_path(ctx)
    if file is None:
        raise click.UsageError("give --scheduler-file: the jobs' workers read it", ctx)
    address = scheduler_address(ctx, None)
    try:
        template = JobTemplate(
            name="slurm",
            cores=cores,
            memory=memory,
            processes=processes,
            gpus=gpus,
            resources=resources or "",
            walltime=walltime,
            queue=queue,
            account=account,
            job_extra_directives=list(sbatch_args),
            job_script_prologue=list(prologue),
            python=python,
            log_directory=str(Path(log_directory).absolute()),
        )
        policy = Policy(min_workers, max_workers, backlog, idle_timeout, max_failures, pause)
        security = Security.from_environment()
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    directory = private_dir(Path(log_directory).absolute() / ".apportion")
    tls, written = credential_files(security, directory, "alloc")
    batch = SlurmBatch([template], str(Path(file).absolute()), tls_files=tls)
    if dry_run:
        click.echo(batch.script(template.name), nl=False)
        return
    allocator = Allocator([template.shape()])
    allocator.adapt(policy)
    try:
        asyncio.run(_serve(address, security, allocator, batch, interval, keep_jobs))
    except (OSError, TimeoutError, AuthenticationError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()


async def _serve(
    address: str,
    security: Security,
    allocator: Allocator,
    batch: SlurmBatch,
    interval: float,
    keep_jobs: bool,
) -> None:
    from apportion.client.client import Client
    from apportion.deploy.adaptive import Adaptive, Observation

    client = await Client(
        address, security=security, asynchronous=True, timeout=30, wait_for_scheduler=False
    )

    async def observe() -> Observation:
        found = await client.waiting_work()
        return found["queued"], found["workers"]

    adaptive = Adaptive(allocator, batch, observe, interval=interval)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    adaptive.start()
    announce(f"apportion alloc slurm: growing the cluster at {address}")
    try:
        await stop.wait()
    finally:
        logger.info("stopping%s", "" if keep_jobs else "; cancelling the jobs submitted")
        await adaptive.stop(cancel_jobs=not keep_jobs)
        await client.close()
