"""``apportion alloc slurm|sge``: grow a running cluster with batch jobs as its work needs.

It runs beside a scheduler (on the login node, say, in ``tmux``), asks it every few
seconds what is waiting, and submits worker jobs of one shape (``sbatch``, ``qsub``)
when waiting work fits that shape and cannot start, cancelling them when idle
(``deploy.allocator``, one machine for both systems). The jobs find the scheduler
through ``--scheduler-file``, which must be on a file system the compute nodes
share. On exit it cancels the jobs it submitted, unless ``--keep-jobs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from apportion.deploy.adaptive import Batch, ScriptBatch
    from apportion.deploy.allocator import Allocator
    from apportion.deploy.job_template import JobTemplate

logger = logging.getLogger("apportion.deploy")


@click.group("alloc")
def alloc() -> None:
    """Grow a running cluster through a batch system as its waiting work needs."""


def _common_options(command: Any) -> Any:
    """The options every ``alloc`` command has: the job's size, the policy, the loop."""
    options: list[Callable[[Any], Any]] = [
        scheduler_file_option,
        click.option("--memory", help="Memory per job (16GiB); none: the batch system's default."),
        click.option(
            "--processes",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Worker processes per job.",
        ),
        click.option(
            "--resources",
            callback=check_resources,
            help="Pools of your own each worker offers besides cpus, memory and GPUs "
            '("licence=2").',
        ),
        click.option(
            "--walltime",
            default="01:00:00",
            show_default=True,
            help="Time limit of each job; its workers drain a minute before it.",
        ),
        click.option(
            "--prologue",
            multiple=True,
            metavar="LINE",
            help="A line the job runs before the worker (module load ...); repeatable.",
        ),
        click.option(
            "--python",
            default=sys.executable,
            show_default=True,
            help="The Python with apportion installed, on the compute nodes.",
        ),
        click.option("--min-workers", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--max-workers", type=click.IntRange(min=0), default=100, show_default=True),
        click.option(
            "--backlog",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Jobs waiting in the batch queue at most.",
        ),
        click.option(
            "--idle-timeout",
            type=click.FloatRange(min=0),
            default=300.0,
            show_default=True,
            metavar="SECONDS",
            help="Cancel a job whose workers were all idle this long.",
        ),
        click.option(
            "--max-failures",
            type=click.IntRange(min=1),
            default=3,
            show_default=True,
            help="Failed submissions in a row before pausing.",
        ),
        click.option(
            "--pause",
            type=click.FloatRange(min=0),
            default=300.0,
            show_default=True,
            metavar="SECONDS",
            help="How long to pause submitting after repeated failures.",
        ),
        click.option(
            "--interval",
            type=click.FloatRange(min=0.1),
            default=2.0,
            show_default=True,
            metavar="SECONDS",
            help="How often to look at the waiting work.",
        ),
        click.option("--keep-jobs", is_flag=True, help="Leave the jobs running on exit."),
        click.option("--dry-run", is_flag=True, help="Print the batch script and exit."),
        log_format_option,
        click.argument("directives", nargs=-1, type=click.UNPROCESSED),
        click.pass_context,
    ]
    for option in reversed(options):
        command = option(command)
    return command


@dataclass(frozen=True)
class Common:
    """The values of ``_common_options`` a command passes on."""

    memory: str | None
    processes: int
    resources: str | None
    walltime: str
    prologue: tuple[str, ...]
    python: str
    log_directory: str
    directives: tuple[str, ...]
    min_workers: int
    max_workers: int
    backlog: int
    idle_timeout: float
    max_failures: int
    pause: float
    interval: float
    keep_jobs: bool
    dry_run: bool
    log_format: str


@alloc.command("slurm", context_settings={"ignore_unknown_options": True})
@click.option(
    "--cores",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="CPUs per job (--cpus-per-task); threads are split among --processes.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="GPUs per job (--gres=gpu:N); tasks see only those Slurm granted.",
)
@click.option("--partition", "queue", help="Slurm partition (--partition).")
@click.option("--account", help="Slurm account (--account).")
@click.option(
    "--log-directory",
    type=click.Path(file_okay=False),
    default="apportion-slurm",
    show_default=True,
    help="Where job scripts and job output go.",
)
@_common_options
def slurm(
    ctx: click.Context,
    cores: int,
    gpus: int,
    queue: str | None,
    account: str | None,
    log_directory: str,
    directives: tuple[str, ...],
    **common: Any,
) -> None:
    """Submit worker jobs with sbatch while waiting work fits them; cancel idle ones.

    Arguments after -- are added to every job as #SBATCH directives:

    \b
      apportion alloc slurm --scheduler-file ~/scheduler.json --cores 8 \\
          --memory 32GiB --gpus 1 --max-workers 4 -- --constraint=a100
    """
    from apportion.deploy.adaptive import SlurmBatch
    from apportion.deploy.job_template import JobTemplate

    given = Common(log_directory=log_directory, directives=directives, **common)

    def template() -> JobTemplate:
        return JobTemplate(
            name="slurm",
            cores=cores,
            gpus=gpus,
            queue=queue,
            account=account,
            **_template_fields(given),
        )

    _run_alloc(ctx, "slurm", given, template, SlurmBatch)


@alloc.command("sge", context_settings={"ignore_unknown_options": True})
@click.option(
    "--cores",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Slots per job (-pe PE N, which more than one needs); threads are split among "
    "--processes.",
)
@click.option("--pe", help="The parallel environment giving the slots on one host (-pe).")
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="GPUs per job, as the consumable --gpu-resource (-l gpu=N).",
)
@click.option(
    "--gpu-resource",
    default="gpu",
    show_default=True,
    help="The name of the site's GPU consumable complex.",
)
@click.option("--queue", help="Grid Engine queue (-q).")
@click.option("--project", help="Grid Engine project (-P).")
@click.option("--resource-spec", help='More -l requests, e.g. "mem_free=4G,scratch=10G".')
@click.option(
    "--log-directory",
    type=click.Path(file_okay=False),
    default="apportion-sge",
    show_default=True,
    help="Where job scripts and job output go.",
)
@_common_options
def sge(
    ctx: click.Context,
    cores: int,
    pe: str | None,
    gpus: int,
    gpu_resource: str,
    queue: str | None,
    project: str | None,
    resource_spec: str | None,
    log_directory: str,
    directives: tuple[str, ...],
    **common: Any,
) -> None:
    """Submit worker jobs with qsub while waiting work fits them; delete idle ones.

    Arguments after -- are added to every job as #$ directives (one per argument):

    \b
      apportion alloc sge --scheduler-file ~/scheduler.json --cores 8 --pe smp \\
          --memory 32GiB --gpus 1 --max-workers 4 -- "-l arch=lx-amd64"
    """
    from apportion.deploy.sge_batch import SGEBatch
    from apportion.deploy.sge_template import SGEJobTemplate

    given = Common(log_directory=log_directory, directives=directives, **common)

    def template() -> SGEJobTemplate:
        return SGEJobTemplate(
            name="sge",
            cores=cores,
            pe=pe,
            gpus=gpus,
            gpu_resource=gpu_resource,
            queue=queue,
            project=project,
            resource_spec=resource_spec,
            **_template_fields(given),
        )

    _run_alloc(ctx, "sge", given, template, SGEBatch)


def _template_fields(given: Common) -> dict[str, Any]:
    return {
        "memory": given.memory,
        "processes": given.processes,
        "resources": given.resources or "",
        "walltime": given.walltime,
        "job_extra_directives": list(given.directives),
        "job_script_prologue": list(given.prologue),
        "python": given.python,
        "log_directory": str(Path(given.log_directory).absolute()),
    }


def _run_alloc(
    ctx: click.Context,
    system: str,
    given: Common,
    make_template: Callable[[], JobTemplate],
    batch_class: type[ScriptBatch],
) -> None:
    from apportion.deploy.adaptive import credential_files
    from apportion.deploy.allocator import Allocator, Policy
    from apportion.home import private_dir

    configure_logging("alloc", given.log_format)
    file = scheduler_file_path(ctx)
    if file is None:
        raise click.UsageError("give --scheduler-file: the jobs' workers read it", ctx)
    address = scheduler_address(ctx, None)
    try:
        template = make_template()
        policy = Policy(
            given.min_workers,
            given.max_workers,
            given.backlog,
            given.idle_timeout,
            given.max_failures,
            given.pause,
        )
        security = Security.from_environment()
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    directory = private_dir(Path(given.log_directory).absolute() / ".apportion")
    tls, written = credential_files(security, directory, "alloc")
    batch = batch_class([template], str(Path(file).absolute()), tls_files=tls)
    if given.dry_run:
        click.echo(batch.script(template.name), nl=False)
        return
    allocator = Allocator([template.shape()])
    allocator.adapt(policy)
    try:
        asyncio.run(
            _serve(system, address, security, allocator, batch, given.interval, given.keep_jobs)
        )
    except (OSError, TimeoutError, AuthenticationError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()


async def _serve(
    system: str,
    address: str,
    security: Security,
    allocator: Allocator,
    batch: Batch,
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
    announce(f"apportion alloc {system}: growing the cluster at {address}")
    try:
        await stop.wait()
    finally:
        logger.info("stopping%s", "" if keep_jobs else "; cancelling the jobs submitted")
        await adaptive.stop(cancel_jobs=not keep_jobs)
        await client.close()
