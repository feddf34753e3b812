"""``apportion slurm -- COMMAND``: a cluster on a Slurm allocation's nodes, for one command.

The orchestration is ``apportion.deploy.slurm_launch``; its decisions are in
``apportion.deploy.slurm_plan``. This module only reads the options.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from apportion.cli.errors import fail
from apportion.cli.log_options import log_format_option
from apportion.deploy.slurm_env import NotInAllocation
from apportion.deploy.slurm_plan import LaunchOptions, default_scheduler_file, slurm_job
from apportion.log_setup import configure_logging

if TYPE_CHECKING:
    from apportion.client.client import Client
    from apportion.net.security import Security


@click.command(
    "slurm",
    context_settings={"allow_interspersed_args": False},
)
@click.option(
    "--nworkers-per-node",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes on each node of the allocation.",
)
@click.option(
    "--nthreads",
    type=click.IntRange(min=1),
    help="Task threads of each worker process (default: the node's granted CPUs "
    "divided among its workers).",
)
@click.option(
    "--resources",
    default="",
    metavar="EXTRA",
    help='Pools each worker offers besides what Slurm granted its node, e.g. "licence=2" '
    "(a pool named here replaces the granted one of that name).",
)
@click.option(
    "--scheduler-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the scheduler file  [default: apportion-scheduler-$SLURM_JOB_ID"
    ".json in the current directory, which the nodes must share].",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Once COMMAND ends (or the job is cancelled), how long workers get to finish.",
)
@click.option(
    "--register-timeout",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for every node's workers before giving up.",
)
@log_format_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def slurm(
    ctx: click.Context,
    nworkers_per_node: int,
    nthreads: int | None,
    resources: str,
    scheduler_file: Path | None,
    drain_timeout: float,
    register_timeout: float,
    log_format: str,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND with a cluster on this Slurm allocation, then stop the cluster.

    From an sbatch script or an salloc shell: starts the scheduler on this node, one
    worker supervisor per node (one srun step, --resources slurm: what Slurm granted
    that node), waits until every node's workers have registered, and runs COMMAND
    with APPORTION_SCHEDULER_FILE set, where Client() connects. Exits with COMMAND's
    status; SIGTERM (scancel) or SIGINT stops everything first.
    """
    configure_logging("slurm", log_format)
    try:
        job = slurm_job(os.environ)
    except NotInAllocation as exc:
        fail(ctx, str(exc))
    except ValueError as exc:
        fail(ctx, str(exc))
    from apportion.core.resources import parse_resources
    from apportion.deploy.launch import LaunchError
    from apportion.deploy.slurm_launch import SlurmLaunch

    try:
        parse_resources(resources)
    except ValueError as exc:
        fail(ctx, f"--resources: {exc}")
    options = LaunchOptions(nworkers_per_node, nthreads, resources, drain_timeout, register_timeout)
    path = (scheduler_file or default_scheduler_file(job, Path.cwd())).absolute()
    launch = SlurmLaunch(job, options, path, command, launch_client)
    try:
        status = launch.run()
    except LaunchError as exc:
        fail(ctx, str(exc), code=1)
    sys.exit(status)


def launch_client(scheduler_file: Path, security: Security) -> Client:
    """A client of the job's scheduler, to see its workers register (not the default
    client: COMMAND's own clients are the job's). One try: the scheduler writes its
    file once it listens, so a refusal means it is gone, not starting."""
    from apportion.client.client import Client

    return Client(
        scheduler_file=scheduler_file,
        security=security,
        set_as_default=False,
        wait_for_scheduler=False,
    )
