"""``apportion scheduler``: run the scheduler until interrupted, or process the queue once.

A scheduler serves the run journal (``$APPORTION_HOME/runs.db`` unless ``--journal``
names another): it picks up staged runs, resumes queued ones after a restart and
adopts those still running on workers that come back. One scheduler at a time
serves a journal; a second one on the default journal runs without it (and says
so), one pointed at a busy journal with ``--journal`` refuses to start.

It serves the web dashboard at ``--dashboard-address`` (``:8787``: port 8787 on
``--host``, or a free port if that one is taken) unless ``--no-dashboard``, and
logs a one-time login link to it (docs/dashboard.md).

With no ``--port`` it listens on 8786, or on a free port if that one is taken (another
user's scheduler, or another of this user's), and says so. Its address and secret go
to ``$APPORTION_HOME/scheduler.json``, where the other commands find the user's own
scheduler, unless another running scheduler holds that file: this one then writes
``scheduler-<port>.json`` beside it and says so (``cli/own_file.py``). Each removes
only its own file on exit.

``--run-once`` starts an embedded cluster (this scheduler and one worker with
``--resources``), processes the staged runs it can run, and exits when nothing it
can run is left: status 0 if every staged run completed; 1 if one failed, or if a
staged run it can never run (its --resources lack what the run asks) was left
staged, each such run named with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import signal
import sys
import time
from pathlib import Path

import click
from click.core import ParameterSource

from apportion.cli.credentials import credential_options
from apportion.cli.errors import check_host_option, check_port_option, fail
from apportion.cli.log_options import announce, log_format_option
from apportion.cli.own_file import OwnSchedulerFile
from apportion.cli.worker import check_resources
from apportion.core.durations import seconds
from apportion.core.resources import describe_resources, parse_supply
from apportion.dashboard.origin import bind_address
from apportion.log_setup import configure_logging
from apportion.net.address import DEFAULT_PORT
from apportion.net.discovery import running_elsewhere
from apportion.net.scheduler_claim import own_sightings
from apportion.net.scheduler_file import default_scheduler_file, write_scheduler_file
from apportion.net.security import PlaintextRefused, Security, check_exposure
from apportion.people_file import PeopleFileError, people_path
from apportion.runs.journal import Journal, JournalBusy, JournalError, default_journal_path
from apportion.runs.launcher import ProcessLauncher
from apportion.runs.live import LiveRuns
from apportion.runs.overview import JournalOverview
from apportion.runs.queue import QueueOptions, RunQueue
from apportion.runs.service import RunsService
from apportion.runs.spec import format_array
from apportion.scheduler.companions import Companion
from apportion.scheduler.service import Scheduler
from apportion.scheduler.state import SchedulerConfig

logger = logging.getLogger("apportion.scheduler")


def _check_dashboard_address(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Click callback for ``--dashboard-address``: one of the forms it takes."""
    try:
        bind_address(value, "127.0.0.1")
    except ValueError as exc:
        fail(ctx, f"--dashboard-address: {exc}")
    return value


def _check_preempt_after(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> float | None:
    """Click callback for ``--preempt-after``: a positive duration, in seconds."""
    if value is None:
        return None
    try:
        after = seconds(value, "--preempt-after")
    except ValueError as exc:
        fail(ctx, str(exc))
    if after is None or not after > 0:
        fail(ctx, f"--preempt-after: {value!r} is not a positive duration (examples: 30s, 10m)")
    return after


@click.command("scheduler")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    callback=check_host_option,
    help="Interface to listen on.",
)
@click.option(
    "--port",
    type=str,  # checked by the callback, in one line rather than a usage banner
    default=str(DEFAULT_PORT),
    callback=check_port_option,
    help="Port for workers and clients (0: any free port)  [default: 8786, or a free "
    "port if that one is taken].",
)
@click.option(
    "--worker-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=SchedulerConfig().worker_timeout,
    show_default=True,
    metavar="SECONDS",
    help="Declare a worker lost (its tasks run elsewhere) when nothing, not even a "
    "heartbeat, has come from it for this long.",
)
@click.option(
    "--max-worker-deaths",
    type=click.IntRange(min=1),
    default=SchedulerConfig().max_worker_deaths,
    show_default=True,
    help="Fail a task (WorkerCrashedError, saying how each worker died) once this many "
    "workers died while running it, instead of letting it kill worker after worker.",
)
@click.option(
    "--preempt-after",
    metavar="DURATION",
    callback=_check_preempt_after,
    help="Stop a --preemptible run (SIGTERM, its worker's grace, SIGKILL) and queue it "
    "again when someone's work has waited this long below their fair share and would "
    "fit in its place; a run is never stopped before it has run this long either. "
    "Examples: 30s, 10m, 1h.  [default: never]",
)
@click.option(
    "--journal",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The run journal (SQLite) to serve  [default: $APPORTION_HOME/runs.db, "
    "~/.apportion/runs.db].",
)
@click.option("--no-journal", is_flag=True, help="Serve no run journal (Python tasks only).")
@click.option(
    "--adopt-grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="After a restart, how long runs that were running wait for their worker to "
    "reconnect and be adopted before they are queued again (or marked lost).",
)
@click.option(
    "--run-once",
    is_flag=True,
    help="Start an embedded cluster with --resources, run the staged runs it can run, "
    "and exit when none is left: status 1 if a run failed or one it cannot run was left.",
)
@click.option(
    "--resources",
    callback=check_resources,
    help='With --run-once: the embedded cluster\'s resources, e.g. "foo=7" or "gpu=[0,1]".',
)
@click.option(
    "--nthreads",
    type=click.IntRange(min=1),
    help="With --run-once: runs side by side at most (default: CPU count).",
)
@click.option(
    "--scheduler-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the address and secret here (mode 0600) for workers and clients to read "
    "(--scheduler-file, Client(scheduler_file=...)); refused if another running "
    "scheduler writes it  [default: $APPORTION_HOME/scheduler.json, where commands "
    "given no address look; $APPORTION_HOME/scheduler-PORT.json while another "
    "scheduler of yours holds that one].",
)
@click.option(
    "--allow-plaintext",
    is_flag=True,
    help="Listen on a non-loopback --host without TLS: anyone on the network can then "
    "read the traffic (the secret still keeps them from running code).",
)
@log_format_option
@click.option(
    "--dashboard-address",
    default=":8787",
    show_default=True,
    metavar="ADDRESS",
    callback=_check_dashboard_address,
    help="Serve the web dashboard here: host:port, or :port on --host (a free port if "
    "that one is taken). A non-loopback host needs TLS or --allow-plaintext.",
)
@click.option("--no-dashboard", is_flag=True, help="Serve no web dashboard.")
@credential_options
@click.pass_context
def scheduler(
    ctx: click.Context,
    host: str,
    port: int,
    worker_timeout: float,
    max_worker_deaths: int,
    preempt_after: float | None,
    journal: Path | None,
    no_journal: bool,
    adopt_grace: float,
    run_once: bool,
    resources: str | None,
    nthreads: int | None,
    scheduler_file: Path | None,
    allow_plaintext: bool,
    log_format: str,
    dashboard_address: str,
    no_dashboard: bool,
) -> None:
    """Run a scheduler that workers and clients connect to.

    Every connection must prove it knows the cluster's secret: --token or the
    environment's, else this account's own ($APPORTION_HOME/secret, made on first use).
    The address and the secret go to --scheduler-file for the others to read: the
    commands of this account given no address find the scheduler there."""
    configure_logging("scheduler", log_format)
    if (resources or nthreads) and not run_once:
        raise click.UsageError("--resources and --nthreads go with --run-once")
    if run_once and no_journal:
        raise click.UsageError("--run-once runs the journal's staged runs; drop --no-journal")
    try:
        security = Security.from_environment(create=True)
        check_exposure(host, security, allow_plaintext=allow_plaintext)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    dashboard = None if no_dashboard or run_once else dashboard_address
    # The default port may be another user's scheduler's: only a port asked for is
    # worth failing over.
    fallback = ctx.get_parameter_source("port") is ParameterSource.DEFAULT
    listen = Listening(
        host, port, security, allow_plaintext, scheduler_file, dashboard, fallback=fallback
    )
    if preempt_after is not None:
        logger.info(
            "preemptible runs are stopped for work that waited %gs below its fair share",
            preempt_after,
        )
    config = SchedulerConfig(
        worker_timeout=worker_timeout,
        max_worker_deaths=max_worker_deaths,
        preempt_after=preempt_after,
    )
    opened = None if no_journal else _open_journal(journal)
    try:
        if run_once:
            assert opened is not None
            sys.exit(asyncio.run(_run_once(listen, opened, resources, nthreads, config)))
        options = QueueOptions(adopt_grace=adopt_grace)
        asyncio.run(_run(listen, config, opened, options, explicit=journal is not None))
    except (PlaintextRefused, PeopleFileError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(_port_taken(host, port)) from None
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None
    finally:
        if opened is not None:
            opened.close()


def _port_taken(host: str, port: int) -> str:
    """The one line for a --port already taken, with where this user's scheduler is."""
    mine = running_elsewhere(own_sightings(default_scheduler_file()))
    also = f"; {mine}" if mine else ""
    return f"cannot listen on {host}:{port}: the port is taken{also}; --port 0 takes any free port"


def _open_journal(path: Path | None) -> Journal:
    try:
        return Journal(path or default_journal_path())
    except (JournalError, OSError) as exc:
        raise click.ClickException(f"cannot open the run journal: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Listening:
    """Where and how the scheduler listens, and where it says so."""

    host: str
    port: int
    security: Security
    allow_plaintext: bool
    scheduler_file: Path | None
    #: Where the dashboard listens; None for none.
    dashboard: str | None = None
    #: Listen on a free port if ``port`` is taken (it was not asked for), and say so.
    fallback: bool = False

    def scheduler(self, config: SchedulerConfig, companions: list[Companion]) -> Scheduler:
        journals = [c.journal.path for c in companions if isinstance(c, RunsService)]
        # The people the owner admits are kept beside the journal, as the runs are;
        # a scheduler serving none keeps them in memory only (and says so to the owner).
        return Scheduler(
            self.host,
            self.port,
            config=config,
            companions=companions,
            security=self.security,
            allow_plaintext=self.allow_plaintext,
            dashboard_address=self.dashboard,
            dashboard_runs=JournalOverview(journals[0]) if journals else None,
            port_fallback=self.fallback,
            people_file=people_path(Path(journals[0])) if journals else None,
        )


async def _start(
    listen: Listening,
    config: SchedulerConfig,
    journal: Journal | None,
    options: QueueOptions,
    *,
    explicit: bool,
) -> tuple[Scheduler, RunQueue | None]:
    """A started scheduler, and its job queue if it serves ``journal``."""
    if journal is not None:
        # Claimed before anything listens, so that a busy journal is known before the
        # dashboard is started and announced, rather than after (and again).
        try:
            journal.claim("")
        except JournalBusy as exc:
            if explicit:
                raise click.ClickException(str(exc)) from None
            logger.warning("%s; this scheduler serves no run journal", exc)
            journal = None
    if journal is None:
        return await listen.scheduler(config, []).start(), None
    runs = RunsService(journal, options)
    return await listen.scheduler(config, [runs]).start(), runs.queue


async def _run(
    listen: Listening,
    config: SchedulerConfig,
    journal: Journal | None,
    options: QueueOptions,
    *,
    explicit: bool,
) -> None:
    own = OwnSchedulerFile(listen.scheduler_file)  # refused before anything listens
    try:
        await _serve(listen, config, journal, options, own, explicit=explicit)
    finally:
        own.release()


async def _serve(
    listen: Listening,
    config: SchedulerConfig,
    journal: Journal | None,
    options: QueueOptions,
    own: OwnSchedulerFile,
    *,
    explicit: bool,
) -> None:
    """Serve until SIGINT or SIGTERM, the scheduler file written meanwhile."""
    server, _ = await _start(listen, config, journal, options, explicit=explicit)
    try:
        path = own.path_for(server.address)
        assert server.security.token is not None  # a scheduler makes one if need be
        write_scheduler_file(
            path,
            server.address,
            server.security.token,
            server.id,
            dashboard=None if server.dashboard is None else server.dashboard.url,
        )
    except OSError as exc:
        await server.close()
        raise click.ClickException(f"cannot write the scheduler file: {exc}") from None
    except BaseException:
        await server.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    announce(f"apportion scheduler at {server.address}")
    announce(f"scheduler file (address and secret): {path}")
    own.announce_spare()
    try:
        await stop.wait()
    finally:
        logger.info("stopping the scheduler")
        own.release(server.id)
        with contextlib.suppress(Exception):
            await server.close()


def _echo(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


async def _run_once(
    listen: Listening,
    journal: Journal,
    resources: str | None,
    nthreads: int | None,
    config: SchedulerConfig,
) -> int:
    """Process the staged runs on an embedded cluster; the exit status."""
    from apportion.worker.service import Worker

    began = time.monotonic()
    amounts, units = parse_supply(resources)
    # Nothing else can join a cluster on an unannounced port: whatever does not fit
    # this supply never will, and runs left running by a crash are not coming back.
    options = QueueOptions(adopt_grace=0.0, fixed_supply=amounts, echo=_echo)
    # A request this cluster can never meet (1.5 units of an indexed pool, say) fails
    # at once rather than keeping --run-once from ever ending.
    config = dataclasses.replace(config, fail_unsatisfiable=True)
    listen = dataclasses.replace(listen, port=0)
    server, queue = await _start(listen, config, journal, options, explicit=True)
    assert queue is not None
    logger.info("cluster resources: %s", describe_resources(amounts, units) or "(none)")
    worker = Worker(
        server.address,
        nthreads,
        resources,
        name="run-once",
        reconnect_timeout=0,
        long_lived=LiveRuns(ProcessLauncher()),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await worker.start()
        logger.info("processing staged runs")
        while not queue.idle() and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
    finally:
        await worker.close()
        await server.close()
    logger.info("the scheduler ran for %.1f seconds", time.monotonic() - began)
    if stop.is_set():
        logger.warning("interrupted: runs not finished stay in the journal")
        return 1
    left = queue.left_staged
    for text in left.values():
        logger.error("left staged: %s", text)
    if left:
        # Exit 0 would say "every staged run was processed", which they were not.
        one = len(left) == 1
        logger.error(
            "%d staged run%s could not start on this cluster and %s staged; "
            "cancel with apportion cancel %s",
            len(left),
            "" if one else "s",
            "stays" if one else "stay",
            format_array(sorted(left)),
        )
    return 1 if queue.failures or left else 0
