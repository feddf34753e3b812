"""``apportion worker``: one worker process, or a supervisor of several.

Options come, in order of precedence, from the command line, from their environment
variable (``APPORTION_RESOURCES``), from ``--config FILE``, then from built-in
defaults. Resources given by none of these come from Dask's configuration
(``distributed.worker.resources``, ``apportion.worker.dask_config``), as a Dask
worker's would; the source used is logged. A resource spec may contain ``auto``,
replaced here by what the machine has (``apportion.worker.detect``), or ``slurm``,
replaced by what the Slurm allocation granted this node (``apportion.deploy.slurm_env``),
or ``sge``, by what Grid Engine granted this job on this host
(``apportion.deploy.sge_env``); ``--nthreads`` then defaults to the granted CPUs
shared among the processes; with
``--nworkers N --split-units`` the supervisor deals every indexed pool out across the
processes (``apportion.worker.shares``).
Either way each worker process receives an explicit ``--resources`` text of its own.
Memory thresholds left unset take Dask's ``distributed.worker.memory.*`` settings
likewise, and every worker process receives all four explicitly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

import click
from click.core import ParameterSource

from apportion.cli.config import CONFIG_META, config_option
from apportion.cli.credentials import scheduler_address, waiting_scheduler_file_option
from apportion.cli.errors import check_address, check_host_option, check_port_option, fail
from apportion.cli.log_options import log_format_option
from apportion.core.durations import seconds
from apportion.core.resources import parse_resources
from apportion.deploy.sge_env import SGE
from apportion.deploy.slurm_env import SLURM, grant_supply, slurm_grant
from apportion.log_setup import configure_logging
from apportion.worker.dask_config import (
    choose_thresholds,
    dask_memory_thresholds,
    dask_worker_resources,
    log_dask_resources,
)
from apportion.worker.detect import (
    detect_supply,
    expand_auto,
    parse_memory_limit,
    split_auto,
    split_word,
)
from apportion.worker.long_lived import DEFAULT_KILL_GRACE
from apportion.worker.memory_policy import (
    THRESHOLD_NAMES,
    Fraction,
    MemoryThresholds,
    parse_fraction,
    threshold_text,
)
from apportion.worker.shares import split_supply
from apportion.worker.supervisor import RESTART_EXIT, SUPERVISOR_PID_VARIABLE

logger = logging.getLogger("apportion.worker")

#: Seconds a worker started before its scheduler keeps trying to reach it.
DEFAULT_CONNECT_TIMEOUT = 60.0

#: ``--start-method``: fork each worker process from a server that has imported the
#: worker's code (``worker.fork_spawn``), or start a fresh interpreter for each.
FORKSERVER = "forkserver"
SPAWN = "spawn"
START_METHODS = (FORKSERVER, SPAWN)
#: Forking where the system forks (not Windows).
DEFAULT_START_METHOD = FORKSERVER if hasattr(os, "fork") else SPAWN

#: Read for ``--resources`` when the option is not given.
RESOURCES_VARIABLE = "APPORTION_RESOURCES"


def _resources_origin(ctx: click.Context) -> str:
    """How to name where a spec came from in an error message."""
    source = ctx.get_parameter_source("resources")
    if source is ParameterSource.ENVIRONMENT:
        return RESOURCES_VARIABLE
    if source is ParameterSource.DEFAULT_MAP and CONFIG_META in ctx.meta:
        return f"resources in {ctx.meta[CONFIG_META]}"
    return "--resources"


#: The spec that says "no resources" in so many words; an empty text is refused.
NO_RESOURCES = "none"


def check_resources(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Reject a malformed spec at once (exit status 2), keeping the text to pass on.

    ``auto`` is checked here only for what surrounds it; detection runs later, in
    the command, once logging is set up. An empty spec is refused (an unset shell
    variable, most likely); ``none`` asks for no resources and becomes ``""``.
    """
    if value is not None:
        if value.strip().lower() == NO_RESOURCES:
            return ""
        if not value.strip(" \t\n,"):
            fail(
                ctx,
                f"{_resources_origin(ctx)}: the spec {value!r} is empty: give NAME=AMOUNT "
                f"pairs, auto, or {NO_RESOURCES} for no resources",
            )
        try:
            auto, rest = split_auto(value)
            slurm, rest = split_word(rest, SLURM)
            sge, rest = split_word(rest, SGE)
            words = [w for w, given in (("auto", auto), (SLURM, slurm), (SGE, sge)) if given]
            if len(words) > 1:
                raise ValueError(
                    f"{value!r} has both {' and '.join(words)}: each describes the whole "
                    "node, give one"
                )
            parse_resources(rest)
        except ValueError as exc:
            fail(ctx, f"{_resources_origin(ctx)}: {exc}")
    return value


def choose_resources(ctx: click.Context, resources: str | None) -> str | None:
    """apportion's own resources if any of its settings gave them, else Dask's; the
    source is logged, since a worker offering the wrong pools fails only later."""
    if resources is not None:
        logger.info("resources %r from %s", resources, _resources_origin(ctx))
        return resources
    try:
        found = dask_worker_resources(os.environ)
    except ValueError as exc:
        fail(ctx, str(exc))
    if found is None:
        return None
    log_dask_resources(found, "worker")
    return found.spec


def resolve_resources(ctx: click.Context, resources: str | None) -> str | None:
    """``resources`` with ``auto`` replaced by the detected pools, or ``slurm`` or
    ``sge`` by the granted ones (logged once)."""
    if resources is None:
        return None
    if split_word(resources, SGE)[0]:
        return _resolve_sge(ctx, resources)
    if split_word(resources, SLURM)[0]:
        try:
            expanded = expand_auto(resources, grant_supply(slurm_grant(os.environ)), SLURM)
        except ValueError as exc:  # outside an allocation, or a malformed variable
            fail(ctx, f"{_resources_origin(ctx)}: {SLURM}: {exc}")
        logger.info("resources %r granted by Slurm as %r", resources, expanded)
        return expanded
    if not split_auto(resources)[0]:
        return resources
    try:
        expanded = expand_auto(resources, detect_supply())
    except ValueError as exc:  # a malformed CUDA_VISIBLE_DEVICES
        fail(ctx, f"{_resources_origin(ctx)}: auto: {exc}")
    logger.info("resources %r detected as %r", resources, expanded)
    return expanded


def check_fraction(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> Fraction | None:
    """A memory threshold: a fraction of the limit in (0, 1], or ``off``; None if not given."""
    if value is None:
        return None
    try:
        return parse_fraction(value, f"--{(param.name or '').replace('_', '-')}")
    except ValueError as exc:
        fail(ctx, str(exc))


def _resolve_sge(ctx: click.Context, resources: str) -> str:
    """``sge`` replaced by Grid Engine's grant (asked of ``qstat -j``: see
    ``apportion.deploy.sge_query``), which is loaded only here."""
    from apportion.deploy.sge_env import grant_note
    from apportion.deploy.sge_env import grant_supply as sge_supply
    from apportion.deploy.sge_query import current_grant

    try:
        grant = current_grant()
        expanded = expand_auto(resources, sge_supply(grant), SGE)
    except ValueError as exc:  # outside a job, qstat refused, or a malformed answer
        fail(ctx, f"{_resources_origin(ctx)}: {SGE}: {exc}")
    note = grant_note(grant)
    if note is not None:
        logger.warning("%s", note)
    logger.info("resources %r granted by Grid Engine as %r", resources, expanded)
    return expanded


def _sge_slots(ctx: click.Context) -> int:
    """This host's slots of the Grid Engine job (``sge`` resolved already, so valid)."""
    import socket

    from apportion.deploy.sge_env import host_slots
    from apportion.deploy.sge_query import current_job

    try:
        return host_slots(current_job(), socket.gethostname())
    except ValueError as exc:
        fail(ctx, f"{SGE}: {exc}")


def choose_memory_thresholds(
    ctx: click.Context, given: dict[str, Fraction | None], limit: int
) -> MemoryThresholds:
    """The options given, then Dask's ``distributed.worker.memory.*``, then the defaults.

    Without a limit the thresholds mean nothing: Dask is not loaded to read them.
    """
    set_here = {name: value for name, value in given.items() if value is not None}
    if len(set_here) == len(THRESHOLD_NAMES) or not limit:
        return MemoryThresholds(**set_here)
    try:
        found = dask_memory_thresholds(os.environ)
    except ValueError as exc:
        fail(ctx, str(exc))
    return choose_thresholds(set_here, found, "worker")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What each worker process is told: the options that reach ``Worker``."""

    nthreads: int | None = None
    resources: str | None = None
    name: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    heartbeat_interval: float = 1.0
    reconnect_timeout: float = 120.0
    #: Bytes of resident memory per process (0: no limit), enforced by the supervisor.
    memory_limit: int = 0
    #: Seconds a SIGTERM-ed worker gets to finish its tasks and hand off its results.
    drain_timeout: float = 30.0
    #: Seconds a stopped command run gets between SIGTERM and SIGKILL.
    kill_grace: float = DEFAULT_KILL_GRACE
    #: Seconds to keep trying to reach a scheduler that is not listening yet (0: once).
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    #: When a process with a memory limit spills, pauses, and is killed.
    memory: MemoryThresholds = field(default_factory=MemoryThresholds)
    #: Where each process makes its scratch directory (None: the system's temporary one).
    local_directory: str | None = None
    #: Serve the data port on a non-loopback host without TLS all the same.
    allow_plaintext: bool = False
    #: Seconds after which the worker drains and leaves of its own accord (0: never).
    lifetime: float = 0.0


def child_commands(
    scheduler_address: str, nworkers: int, settings: WorkerSettings, resources: list[str]
) -> list[list[str]]:
    """The command line of each supervised worker process; ``resources`` has one spec each.

    Every value is passed explicitly, so that a child reads neither the config file
    nor ``APPORTION_RESOURCES`` again. The memory limit is not: the supervisor
    enforces it from outside, where a process stuck in C code cannot escape it.
    """
    commands = []
    base = settings.name or f"worker-{os.getpid()}"
    port = settings.port
    for i in range(nworkers):
        argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler_address]
        argv += ["--host", settings.host, "--port", str(port + i if port else 0)]
        if settings.nthreads is not None:
            argv += ["--nthreads", str(settings.nthreads)]
        argv += ["--resources", resources[i] or NO_RESOURCES]
        argv += ["--heartbeat-interval", repr(settings.heartbeat_interval)]
        argv += ["--reconnect-timeout", repr(settings.reconnect_timeout)]
        argv += ["--drain-timeout", repr(settings.drain_timeout)]
        argv += ["--kill-grace", repr(settings.kill_grace)]
        argv += ["--connect-timeout", repr(settings.connect_timeout)]
        argv += ["--memory-limit", str(settings.memory_limit)]
        for threshold in THRESHOLD_NAMES:
            argv += [f"--memory-{threshold}", threshold_text(getattr(settings.memory, threshold))]
        if settings.local_directory is not None:
            argv += ["--local-directory", settings.local_directory]
        if settings.allow_plaintext:
            argv += ["--allow-plaintext"]
        if settings.lifetime:
            argv += ["--lifetime", repr(settings.lifetime)]
        argv += ["--nworkers", "1", "--no-supervisor", "--name", f"{base}-{i}"]
        commands.append(argv)
    return commands


def child_names(commands: list[list[str]]) -> list[str]:
    return [argv[argv.index("--name") + 1] for argv in commands]


@click.command("worker")
@click.argument(
    "given_address", metavar="SCHEDULER_ADDRESS", required=False, callback=check_address
)
@waiting_scheduler_file_option
@config_option(
    'TOML file of option defaults (nthreads = 2, resources = "gpu=[0-3]", ...); '
    "command-line options override it."
)
@click.option(
    "--nthreads",
    type=click.IntRange(min=1),
    help="Task threads (default: CPU count; with --resources slurm, the CPUs granted "
    "divided among --nworkers).",
)
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
    'or "auto" (detected GPUs, cpus, memory; may be combined: "auto licence=2"), '
    'or "slurm" (what the Slurm allocation granted this node: cpus, memory, GPUs); '
    '"none" for no resources (an empty spec is refused).',
)
@click.option(
    "--split-units",
    is_flag=True,
    default=False,
    help="With --nworkers, deal each indexed pool (gpu=[0-3]) out across the processes "
    "instead of giving every process all of it.",
)
@click.option("--name", help="Worker name (with --nworkers, suffixed -0, -1, ...).")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    callback=check_host_option,
    help="Data port interface (not loopback: give --tls-cert and --tls-key, or --allow-plaintext).",
)
@click.option(
    "--allow-plaintext",
    is_flag=True,
    help="Serve the data port on a non-loopback --host without TLS: anyone on the "
    "network can then read the data it sends.",
)
@click.option(
    "--port",
    type=str,  # checked by the callback, in one line rather than a usage banner
    default="0",
    callback=check_port_option,
    show_default=True,
    help="Data port (0: any free; with --nworkers, worker i gets PORT+i).",
)
@click.option(
    "--memory-limit",
    default="none",
    show_default=True,
    help="Resident memory allowed to each worker process: a size (4GiB), a fraction of "
    "the machine's memory (0.5), auto (the machine's memory divided among the "
    "processes) or none. Under it a process spills results to disk and pauses as the "
    "--memory-* fractions say; above --memory-terminate of it, it is killed and "
    "restarted by its supervisor, and its tasks count it as a crash, out of memory.",
)
@click.option(
    "--memory-target",
    callback=check_fraction,
    metavar="FRACTION|off",
    help="Results held in memory above this fraction of --memory-limit move to disk, "
    "least recently used first (default 0.6, or Dask's distributed.worker.memory.target).",
)
@click.option(
    "--memory-spill",
    callback=check_fraction,
    metavar="FRACTION|off",
    help="Process memory above this fraction of --memory-limit spills results until it "
    "is back under --memory-target (default 0.7).",
)
@click.option(
    "--memory-pause",
    callback=check_fraction,
    metavar="FRACTION|off",
    help="Process memory above this fraction of --memory-limit pauses the worker: no new "
    "task and no new fetch starts until it falls back (default 0.8).",
)
@click.option(
    "--memory-terminate",
    callback=check_fraction,
    metavar="FRACTION|off",
    help="Process memory above this fraction of --memory-limit has the supervisor kill "
    "and restart the process (default 0.95).",
)
@click.option(
    "--local-directory",
    type=click.Path(file_okay=False),
    help="Where each worker process makes its scratch directory, which results spill "
    "to (default: the system's temporary directory). Removed when the process ends; "
    "the next worker removes those of killed ones.",
)
@click.option(
    "--supervisor/--no-supervisor",
    "supervise",
    default=None,
    help="Run the worker processes under a supervisor that restarts them when they "
    "crash (default: yes with --nworkers above 1 or a --memory-limit).",
)
@click.option(
    "--start-method",
    type=click.Choice(START_METHODS),
    default=DEFAULT_START_METHOD,
    show_default=True,
    help="How the supervisor starts each worker process: forkserver (forked from one "
    "process that has imported the worker's code: a fraction of the CPU) or spawn "
    "(a fresh interpreter each).",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM or SIGINT: stop taking tasks, let running ones finish and hand "
    "results still needed to other workers, for up to this long; a second signal "
    "stops at once.",
)
@click.option(
    "--lifetime",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="Drain and leave after this long (0: never), as on SIGTERM: in a batch job, "
    "set it a little under the walltime so that the job ends with its results handed "
    "off rather than killed.",
)
@click.option(
    "--kill-grace",
    type=click.FloatRange(min=0),
    default=DEFAULT_KILL_GRACE,
    show_default=True,
    metavar="SECONDS",
    help="A command run that is cancelled, timed out or stopped gets SIGTERM, this "
    "long to exit, then SIGKILL (its whole process group).",
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
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_CONNECT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="A worker started before its scheduler keeps trying to reach it for this "
    "long, then exits with status 1; 0: try once.",
)
@click.option(
    "--death-timeout",
    callback=lambda ctx, param, value: _duration(value, "--death-timeout"),
    default=None,
    metavar="DURATION",
    help="Dask's name for both timeouts above: a worker that cannot reach its scheduler "
    "for this long (at start, or after losing it) exits; seconds or text like '60s'.",
)
@log_format_option
@click.pass_context
def worker(
    ctx: click.Context,
    given_address: str | None,
    nthreads: int | None,
    nworkers: int,
    resources: str | None,
    split_units: bool,
    name: str | None,
    host: str,
    port: int,
    memory_limit: str,
    memory_target: Fraction | None,
    memory_spill: Fraction | None,
    memory_pause: Fraction | None,
    memory_terminate: Fraction | None,
    local_directory: str | None,
    supervise: bool | None,
    start_method: str,
    drain_timeout: float,
    kill_grace: float,
    heartbeat_interval: float,
    reconnect_timeout: float,
    connect_timeout: float,
    allow_plaintext: bool,
    lifetime: float,
    death_timeout: float | None,
    log_format: str,
) -> None:
    """Run a worker connected to the scheduler at SCHEDULER_ADDRESS, else the one
    --scheduler-file names, else $APPORTION_SCHEDULER, else your own running scheduler,
    found through $APPORTION_HOME/scheduler.json (waited for up to --connect-timeout)."""
    if death_timeout is not None:  # Dask's one option for both
        connect_timeout = reconnect_timeout = death_timeout
    try:
        limit = parse_memory_limit(memory_limit, nworkers)
    except ValueError as exc:
        fail(ctx, str(exc))
    if supervise is None:
        supervise = nworkers > 1 or limit > 0
    configure_logging("supervisor" if supervise else "worker", log_format)
    address = scheduler_address(ctx, given_address, wait=connect_timeout)
    given = {
        "target": memory_target,
        "spill": memory_spill,
        "pause": memory_pause,
        "terminate": memory_terminate,
    }
    thresholds = choose_memory_thresholds(ctx, given, limit)
    chosen = choose_resources(ctx, resources)
    resolved = resolve_resources(ctx, chosen)
    if nthreads is None and chosen is not None and split_word(chosen, SLURM)[0]:
        # The machine's CPU count is not the job's: threads for the CPUs granted.
        nthreads = max(1, slurm_grant(os.environ).cpus // nworkers)
    if nthreads is None and chosen is not None and split_word(chosen, SGE)[0]:
        nthreads = max(1, _sge_slots(ctx) // nworkers)
    settings = WorkerSettings(
        nthreads,
        resolved,
        name,
        host,
        port,
        heartbeat_interval,
        reconnect_timeout,
        limit,
        drain_timeout,
        kill_grace,
        connect_timeout,
        thresholds,
        local_directory,
        allow_plaintext,
        lifetime,
    )
    if not supervise:
        if nworkers > 1:
            fail(ctx, "--nworkers above 1 needs a supervisor; drop --no-supervisor")
        killing = limit and thresholds.terminate is not False
        if killing and SUPERVISOR_PID_VARIABLE not in os.environ:
            # Under a supervisor the process only spills and pauses; the supervisor kills.
            fail(
                ctx,
                "--memory-limit is enforced by a supervisor (--memory-terminate); "
                "drop --no-supervisor, or give --memory-terminate off",
            )
        sys.exit(run_one(address, settings))
    from apportion.worker.fork_spawn import ForkSpawner
    from apportion.worker.supervisor import Supervisor, popen_spawn, scheduler_reporter

    specs = [settings.resources or ""] * nworkers
    if split_units:
        try:
            specs = split_supply(settings.resources or "", nworkers)
        except ValueError as exc:
            fail(ctx, f"--split-units: {exc}")
    commands = child_commands(address, nworkers, settings, specs)
    forks = ForkSpawner() if start_method == FORKSERVER else None
    supervisor = Supervisor(
        commands,
        spawn=forks or popen_spawn,
        names=child_names(commands),
        memory_limit=limit,
        memory_terminate=thresholds.terminate,
        report=scheduler_reporter(address),
    )
    try:
        # Room for the drain, then for the worker to stop its command runs (TERM,
        # grace, KILL).
        code = supervisor.run(stop_timeout=drain_timeout + kill_grace + 10.0)
    finally:
        if forks is not None:
            forks.close()
    sys.exit(code)


def _duration(value: str | None, what: str) -> float | None:
    """A duration option's seconds (None: not given); a usage error for bad text."""
    try:
        return seconds(value, what)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def run_one(address: str, settings: WorkerSettings) -> int:
    """Run one worker until a signal (status 0) or the loss of its scheduler (status 1).

    The first SIGTERM or SIGINT drains the worker (``Worker.drain``); a second one
    closes it at once. Status 0 tells a supervisor not to start it again.
    """
    from apportion.client import dask_default
    from apportion.net.security import AuthenticationError
    from apportion.runs.launcher import ProcessLauncher
    from apportion.runs.live import LiveRuns
    from apportion.worker.memory_manager import MemoryConfig
    from apportion.worker.service import Worker

    # Dask's own compute inside a task goes where apportion's rules for tasks say.
    dask_default.serve_tasks()

    async def serve() -> int:
        supervisor = supervisor_pid()
        worker = Worker(
            address,
            settings.nthreads,
            settings.resources,
            name=settings.name,
            host=settings.host,
            port=settings.port,
            memory_limit=settings.memory_limit,
            heartbeat_interval=settings.heartbeat_interval,
            reconnect_timeout=settings.reconnect_timeout,
            supervisor=supervisor or 0,
            kill_grace=settings.kill_grace,
            connect_timeout=settings.connect_timeout,
            long_lived=LiveRuns(ProcessLauncher()),  # the job queue's command runs
            allow_plaintext=settings.allow_plaintext,
            memory=MemoryConfig(settings.memory, local_directory=settings.local_directory),
        )
        try:
            await worker.start()
        except (OSError, AuthenticationError) as exc:  # one line, not a traceback
            logger.error("worker %s could not start: %s", worker.name, exc)
            return 1
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        closing: list[asyncio.Task[None]] = []  # keeps the close tasks referenced

        def on_signal(signum: int) -> None:
            how = "draining" if not stopped.is_set() else "closing now"
            logger.info("worker %s: %s received; %s", worker.name, signal.Signals(signum).name, how)
            if stopped.is_set():
                closing.append(loop.create_task(worker.close()))
                return
            stopped.set()
            closing.append(loop.create_task(worker.drain(settings.drain_timeout)))

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        watchers = []
        if supervisor is not None:
            watchers.append(loop.create_task(_stop_when_orphaned(worker, stopped, supervisor)))
        if settings.lifetime:
            watchers.append(loop.create_task(_drain_at_end_of_life(worker, stopped, settings)))
        await worker.finished()
        for watcher in watchers:
            watcher.cancel()
        if worker.restart_requested:
            return RESTART_EXIT  # our supervisor starts a fresh process at once
        return 0 if stopped.is_set() else 1

    return asyncio.run(serve())


async def _stop_when_orphaned(worker: Any, stopped: asyncio.Event, supervisor: int) -> None:
    await parent_changed(supervisor)
    if not stopped.is_set():
        logger.warning("supervisor %d is gone; stopping worker %s", supervisor, worker.name)
        stopped.set()
        await worker.close()  # sends WorkerClosing: a departure, not a lost worker


async def _drain_at_end_of_life(
    worker: Any, stopped: asyncio.Event, settings: WorkerSettings
) -> None:
    await asyncio.sleep(settings.lifetime)
    if not stopped.is_set():
        logger.info("worker %s: lifetime of %gs reached; draining", worker.name, settings.lifetime)
        stopped.set()
        await worker.drain(settings.drain_timeout)


def supervisor_pid() -> int | None:
    """The pid of the ``--nworkers`` supervisor that started this process, if any.

    The variable is removed once read, so that processes our tasks start (which
    have us, not the supervisor, as parent) do not inherit it and stop at once.
    """
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
