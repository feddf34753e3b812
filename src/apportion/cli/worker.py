"""``apportion worker``: one worker process, or a supervisor of several."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import click

from apportion.cli.logs import configure_logging
from apportion.core.resources import parse_resources

logger = logging.getLogger("apportion.worker")


def check_resources(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Reject a malformed spec at once (exit status 2), keeping the text to pass on."""
    if value is not None:
        try:
            parse_resources(value)
        except ValueError as exc:
            # One line, no usage banner: the message already names the bad part.
            click.echo(f"Error: --resources: {exc}", err=True)
            ctx.exit(2)
    return value


@click.command("worker")
@click.argument("scheduler_address")
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
    help='Resources of each worker process, e.g. "GPU=2 MEMORY=16GiB" or "gpu=[0-3]".',
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
def worker(
    scheduler_address: str,
    nthreads: int | None,
    nworkers: int,
    resources: str | None,
    name: str | None,
    host: str,
    port: int,
) -> None:
    """Run a worker connected to the scheduler at SCHEDULER_ADDRESS."""
    configure_logging()
    if nworkers == 1:
        sys.exit(run_one(scheduler_address, nthreads, resources, name, host, port))
    from apportion.worker.supervisor import Supervisor

    base = name or f"worker-{os.getpid()}"
    commands = []
    for i in range(nworkers):
        argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler_address]
        argv += ["--host", host, "--port", str(port + i if port else 0)]
        if nthreads is not None:
            argv += ["--nthreads", str(nthreads)]
        if resources is not None:
            argv += ["--resources", resources]
        argv += ["--nworkers", "1", "--name", f"{base}-{i}"]
        commands.append(argv)
    sys.exit(Supervisor(commands).run())


def run_one(
    address: str,
    nthreads: int | None,
    resources: str | None,
    name: str | None,
    host: str,
    port: int,
) -> int:
    """Run one worker until a signal (status 0) or the loss of its scheduler (status 1)."""
    from apportion.worker.service import Worker

    async def serve() -> int:
        worker = Worker(address, nthreads, resources, name=name, host=host, port=port)
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
