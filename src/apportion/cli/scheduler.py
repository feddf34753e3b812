"""``apportion scheduler``: run the scheduler until interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal

import click

from apportion.cli.logs import configure_logging
from apportion.net.address import DEFAULT_PORT
from apportion.scheduler.service import Scheduler
from apportion.scheduler.state import SchedulerConfig

logger = logging.getLogger("apportion.scheduler")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("scheduler")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port for workers and clients (0: any free port).",
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
def scheduler(host: str, port: int, worker_timeout: float, max_worker_deaths: int) -> None:
    """Run a scheduler that workers and clients connect to."""
    configure_logging()
    if not is_loopback(host):
        logger.warning(
            "listening on %s: any host that reaches this port can submit code to run on "
            "your workers; keep it on a trusted network",
            host,
        )
    try:
        config = SchedulerConfig(worker_timeout=worker_timeout, max_worker_deaths=max_worker_deaths)
        asyncio.run(_run(host, port, config))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None


async def _run(host: str, port: int, config: SchedulerConfig) -> None:
    server = Scheduler(host, port, config=config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    click.echo(f"apportion scheduler at {server.address}", err=True)
    await stop.wait()
    logger.info("stopping the scheduler")
    with contextlib.suppress(Exception):
        await server.close()
