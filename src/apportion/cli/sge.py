"""``apportion sge -- COMMAND``: a cluster on the hosts of a Grid Engine job, for one command.

The orchestration is ``apportion.deploy.sge_launch``; its decisions are in
``apportion.deploy.sge_plan``. This module only reads the options.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

import click

from apportion.cli.errors import fail
from apportion.cli.log_options import log_format_option
from apportion.cli.slurm import launch_client
from apportion.log_setup import configure_logging

logger = logging.getLogger("apportion.cli")


@click.command("sge", context_settings={"allow_interspersed_args": False})
@click.option(
    "--nworkers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes on each host of the job.",
)
@click.option(
    "--nthreads",
    type=click.IntRange(min=1),
    help="Task threads of each worker process (default: the job's slots on its host "
    "divided among the host's workers).",
)
@click.option(
    "--resources",
    default="",
    metavar="EXTRA",
    help='Pools each worker offers besides what Grid Engine granted, e.g. "licence=2" '
    '(a pool named here replaces the granted one of that name, e.g. "gpu=[0]").',
)
@click.option(
    "--scheduler-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the scheduler file  [default: apportion-scheduler-$JOB_ID.json "
    "in the current directory].",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Once COMMAND ends (or the job is deleted), how long workers get to finish.",
)
@click.option(
    "--register-timeout",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for the workers before giving up.",
)
@log_format_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def sge(
    ctx: click.Context,
    nworkers: int,
    nthreads: int | None,
    resources: str,
    scheduler_file: Path | None,
    drain_timeout: float,
    register_timeout: float,
    log_format: str,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND with a cluster on the hosts of a Grid Engine job, then stop the cluster.

    From a qsub script (or a qrsh session): starts the scheduler and one worker
    supervisor per host of the job (through qrsh -inherit, which needs the parallel
    environment's control_slaves TRUE), each offering --resources sge (the slots,
    h_vmem and GPU consumable Grid Engine granted the job there, as qstat -j says),
    waits until every host's workers have registered, and runs COMMAND with
    APPORTION_SCHEDULER_FILE set, where Client() connects. Exits with COMMAND's
    status; SIGTERM, SIGINT or -notify's SIGUSR2 (qdel) stops everything first.
    """
    configure_logging("sge", log_format)
    from apportion.core.resources import parse_resources
    from apportion.deploy.launch import LaunchError
    from apportion.deploy.sge_env import PE_HOSTFILE
    from apportion.deploy.sge_launch import SGELaunch
    from apportion.deploy.sge_plan import PESettings, default_scheduler_file, plan_workers
    from apportion.deploy.sge_query import current_job, current_pe
    from apportion.deploy.slurm_plan import LaunchOptions

    try:
        job = current_job(os.environ)
    except ValueError as exc:  # NotInSGEJob too
        fail(ctx, str(exc))
    try:
        parse_resources(resources)
    except ValueError as exc:
        fail(ctx, f"--resources: {exc}")
    pe: PESettings | None = None
    try:
        pe = current_pe(os.environ)
    except ValueError as exc:  # qconf cannot be asked here: plan_workers assumes the usual
        logger.warning("apportion sge: %s", exc)
    options = LaunchOptions(nworkers, nthreads, resources, drain_timeout, register_timeout)
    path = (scheduler_file or default_scheduler_file(job, Path.cwd())).absolute()
    parallel = bool(os.environ.get(PE_HOSTFILE, "").strip())
    try:
        plan = plan_workers(
            job, socket.gethostname(), pe, parallel, [sys.executable], options, path
        )
    except ValueError as exc:  # this host is not among the job's
        fail(ctx, str(exc))
    launch = SGELaunch(job, plan, options, path, command, launch_client)
    try:
        status = launch.run()
    except LaunchError as exc:
        fail(ctx, str(exc), code=1)
    sys.exit(status)
