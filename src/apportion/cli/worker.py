"""``apportion worker``: one worker process, or a supervisor of several.

Options come, in order of precedence, from the command line, from their environment
variable (``APPORTION_RESOURCES``), from ``--config FILE``, then from built-in
defaults. A resource spec may contain ``auto``, replaced here by what the machine
has (``apportion.worker.detect``); with ``--nworkers N --split-units`` the supervisor
deals every indexed pool out across the processes (``apportion.worker.shares``).
Either way each worker process receives an explicit ``--resources`` text of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import click
from click.core import ParameterSource

from apportion.cli.config import CONFIG_META, config_option
from apportion.cli.logs import configure_logging
from apportion.core.resources import parse_resources
from apportion.worker.detect import detect_supply, expand_auto, split_auto
from apportion.worker.shares import split_supply

logger = logging.getLogger("apportion.worker")

#: Read for ``--resources`` when the option is not given.
RESOURCES_VARIABLE = "APPORTION_RESOURCES"


def _fail(ctx: click.Context, message: str) -> None:
    # One line, no usage banner: the message already names the bad part.
    click.echo(f"Error: {message}", err=True)
    ctx.exit(2)


def _resources_origin(ctx: click.Context) -> str:
    """How to name where a spec came from in an error message."""
    source = ctx.get_parameter_source("resources")
    if source is ParameterSource.ENVIRONMENT:
        return RESOURCES_VARIABLE
    if source is ParameterSource.DEFAULT_MAP and CONFIG_META in ctx.meta:
        return f"resources in {ctx.meta[CONFIG_META]}"
    return "--resources"


def check_resources(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Reject a malformed spec at once (exit status 2), keeping the text to pass on.

    ``auto`` is checked here only for what surrounds it; detection runs later, in
    the command, once logging is set up.
    """
    if value is not None:
        try:
            parse_resources(split_auto(value)[1])
        except ValueError as exc:
            _fail(ctx, f"{_resources_origin(ctx)}: {exc}")
    return value


def resolve_resources(ctx: click.Context, resources: str | None) -> str | None:
    """``resources`` with ``auto`` replaced by the detected pools (logged once)."""
    if resources is None or not split_auto(resources)[0]:
        return resources
    try:
        expanded = expand_auto(resources, detect_supply())
    except ValueError as exc:  # a malformed CUDA_VISIBLE_DEVICES
        _fail(ctx, f"{_resources_origin(ctx)}: auto: {exc}")
    logger.info("resources %r detected as %r", resources, expanded)
    return expanded


def child_commands(
    scheduler_address: str,
    nworkers: int,
    nthreads: int | None,
    resources: list[str],
    base: str,
    host: str,
    port: int,
    liveness: tuple[float, float] = (1.0, 120.0),
) -> list[list[str]]:
    """The command line of each supervised worker process; ``resources`` has one spec each.

    ``liveness`` is ``(heartbeat_interval, reconnect_timeout)``.

    Every value is passed explicitly, so that a child reads neither the config file
    nor ``APPORTION_RESOURCES`` again.
    """
    commands = []
    for i in range(nworkers):
        argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler_address]
        argv += ["--host", host, "--port", str(port + i if port else 0)]
        if nthreads is not None:
            argv += ["--nthreads", str(nthreads)]
        argv += ["--resources", resources[i]]
        argv += ["--heartbeat-interval", repr(liveness[0])]
        argv += ["--reconnect-timeout", repr(liveness[1])]
        argv += ["--nworkers", "1", "--name", f"{base}-{i}"]
        commands.append(argv)
    return commands


@click.command("worker")
@click.argument("scheduler_address")
@config_option(
    'TOML file of option defaults (nthreads = 2, resources = "gpu=[0-3]", ...); '
    "command-line options override it."
)
@click.option("--nthreads", type=click.IntRange(min=1), help="Task threads (default: CPU count).")
@click.option(
    "--nworkers",
    "--nprocs",
    "nworkers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes to run and keep alive (--nprocs is the older Dask spelling).",
)
@click.option(
    "--resources",
    callback=check_resources,
    envvar=RESOURCES_VARIABLE,
    show_envvar=True,
    help='Resources of each worker process, e.g. "GPU=2 MEMORY=16GiB", "gpu=[0-3]", '
    'or "auto" (detected GPUs, cpus, memory; may be combined: "auto licence=2").',
)
@click.option(
    "--split-units",
    is_flag=True,
    default=False,
    help="With --nworkers, deal each indexed pool (gpu=[0-3]) out across the processes "
    "instead of giving every process all of it.",
)
@click.option("--name", help="Worker name (with --nworkers, suffixed -0, -1, ...).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Data port interface.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Data port (0: any free; with --nworkers, worker i gets PORT+i).",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="How often to tell the scheduler this worker is alive; keep it well under "
    "the scheduler's --worker-timeout.",
)
@click.option(
    "--reconnect-timeout",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="After losing the scheduler, keep trying to reconnect (dropping this worker's "
    "tasks and data, registering afresh) for this long before exiting; 0: exit at once.",
)
@click.pass_context
def worker(
    ctx: click.Context,
    scheduler_address: str,
    nthreads: int | None,
    nworkers: int,
    resources: str | None,
    split_units: bool,
    name: str | None,
    host: str,
    port: int,
    heartbeat_interval: float,
    reconnect_timeout: float,
) -> None:
    """Run a worker connected to the scheduler at SCHEDULER_ADDRESS."""
    configure_logging()
    resources = resolve_resources(ctx, resources)
    liveness = (heartbeat_interval, reconnect_timeout)
    if nworkers == 1:
        sys.exit(run_one(scheduler_address, nthreads, resources, name, host, port, liveness))
    from apportion.worker.supervisor import Supervisor

    specs = [resources or ""] * nworkers
    if split_units:
        try:
            specs = split_supply(resources or "", nworkers)
        except ValueError as exc:
            _fail(ctx, f"--split-units: {exc}")
    base = name or f"worker-{os.getpid()}"
    commands = child_commands(
        scheduler_address, nworkers, nthreads, specs, base, host, port, liveness
    )
    sys.exit(Supervisor(commands).run())


def run_one(
    address: str,
    nthreads: int | None,
    resources: str | None,
    name: str | None,
    host: str,
    port: int,
    liveness: tuple[float, float] = (1.0, 120.0),
) -> int:
    """Run one worker until a signal (status 0) or the loss of its scheduler (status 1).

    The scheduler counts as lost once reconnecting has failed for ``liveness[1]``
    seconds (``(heartbeat_interval, reconnect_timeout)``).
    """
    from apportion.worker.service import Worker

    async def serve() -> int:
        worker = Worker(
            address,
            nthreads,
            resources,
            name=name,
            host=host,
            port=port,
            heartbeat_interval=liveness[0],
            reconnect_timeout=liveness[1],
        )
        try:
            await worker.start()
        except OSError as exc:
            logger.error("worker %s could not start: %s", worker.name, exc)
            return 1
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        closing: list[asyncio.Task[None]] = []  # keeps the close task referenced

        def on_signal(signum: int) -> None:
            logger.info("worker %s: %s received; closing", worker.name, signal.Signals(signum).name)
            stopped.set()
            closing.append(loop.create_task(worker.close()))

        async def stop_when_orphaned(supervisor: int) -> None:
            await parent_changed(supervisor)
            if not stopped.is_set():
                logger.warning("supervisor %d is gone; stopping worker %s", supervisor, worker.name)
                stopped.set()
                await worker.close()  # sends WorkerClosing: a departure, not a lost worker

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        supervisor = supervisor_pid()
        watchdog = None if supervisor is None else loop.create_task(stop_when_orphaned(supervisor))
        await worker.finished()
        if watchdog is not None:
            watchdog.cancel()
        return 0 if stopped.is_set() else 1

    return asyncio.run(serve())


def supervisor_pid() -> int | None:
    """The pid of the ``--nworkers`` supervisor that started this process, if any.

    The variable is removed once read, so that processes our tasks start (which
    have us, not the supervisor, as parent) do not inherit it and stop at once.
    """
    from apportion.worker.supervisor import SUPERVISOR_PID_VARIABLE

    value = os.environ.pop(SUPERVISOR_PID_VARIABLE, None)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        logger.warning("ignoring %s=%r: not a pid", SUPERVISOR_PID_VARIABLE, value)
        return None


async def parent_changed(pid: int, interval: float = 0.5) -> None:
    """Return once our parent is no longer ``pid``.

    A supervisor killed with SIGKILL cannot stop its children, and they are
    re-parented (to pid 1 or a subreaper) instead of being signalled; left running
    they would stay registered, and a restarted supervisor would double the workers.
    Polling ``getppid`` works on every platform; twice a second costs nothing.
    """
    while os.getppid() == pid:
        await asyncio.sleep(interval)
