"""``apportion ssh``: a scheduler on the first host and workers on the others, over ssh,
until Ctrl-C (``apportion.deploy.ssh`` does the work; ``ssh_commands`` says how).

Uses the system's ``ssh`` (your config, agent and keys; no paramiko). The cluster's
credentials are made fresh (mutual TLS and a secret) and reach the remote processes
on the ssh channel, never on a command line; the scheduler file written here carries
them for clients of this machine: ``Client(scheduler_file=F)`` needs nothing else.
It is claimed as ``apportion scheduler`` claims its own (``cli/own_file.py``): the
default one is not taken from a running scheduler of the user's.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import click

from apportion.cli.log_options import announce, log_format_option
from apportion.cli.own_file import OwnSchedulerFile
from apportion.cli.worker import check_resources
from apportion.deploy.hostlist import expand_nodelist, read_hostfile
from apportion.deploy.ssh import SSHCluster
from apportion.deploy.ssh_commands import split_ssh_options
from apportion.log_setup import configure_logging
from apportion.net.address import DEFAULT_PORT


@click.command("ssh")
@click.argument("hosts", nargs=-1)
@click.option(
    "--hostfile",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="One host or Slurm node list (node[01-04]) per line; '#' comments. Read before "
    "the HOSTS given as arguments.",
)
@click.option(
    "--nworkers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes per worker host.",
)
@click.option(
    "--nthreads",
    type=click.IntRange(min=1),
    help="Task threads per worker process (default: the host's CPU count).",
)
@click.option(
    "--resources",
    callback=check_resources,
    help='Every worker\'s resources, e.g. "gpu=[0,1] licence=2".',
)
@click.option(
    "--remote-python",
    metavar="PATH",
    help="The Python with apportion on the remote hosts  [default: this one's path].",
)
@click.option(
    "--scheduler-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="The scheduler's port (0: any free).",
)
@click.option(
    "--ssh-option",
    "ssh_options",
    multiple=True,
    metavar="ARGS",
    help='Arguments for ssh, repeatable: --ssh-option "-p 2222" '
    '--ssh-option "-o StrictHostKeyChecking=no".',
)
@click.option(
    "--scheduler-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the address, secret and a client's TLS credentials here (mode 0600); "
    "refused if a running scheduler writes it  [default: $APPORTION_HOME/scheduler.json, "
    "or $APPORTION_HOME/scheduler-PORT.json while another scheduler of yours holds it].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the scheduler may take to start.",
)
@log_format_option
def ssh(
    hosts: tuple[str, ...],
    hostfile: Path | None,
    nworkers: int,
    nthreads: int | None,
    resources: str | None,
    remote_python: str | None,
    scheduler_port: int,
    ssh_options: tuple[str, ...],
    scheduler_file: Path | None,
    timeout: float,
    log_format: str,
) -> None:
    """Start a cluster over ssh: the scheduler on the first host, workers on the others
    (name a host twice for both), until Ctrl-C stops it (workers drain first).

    HOSTS are host names or Slurm node lists (gpu[1-4]). They are reached through the
    system's ssh binary (no paramiko): your ~/.ssh/config, agent and keys apply, and
    hosts that would prompt for a password or an unknown host key fail instead.
    The cluster gets fresh TLS credentials and secret, sent over the ssh channel and
    never on a command line; the remote processes stop when their connection closes."""
    configure_logging("ssh", log_format)
    try:
        names = _hosts(hostfile, hosts)
        options = split_ssh_options(ssh_options)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    stop = threading.Event()
    own = OwnSchedulerFile(scheduler_file)  # refused before any host is reached
    try:
        cluster = _start(
            names,
            options,
            nworkers,
            nthreads,
            resources,
            remote_python,
            scheduler_port,
            timeout,
            stop,
        )
    except BaseException:
        own.release()
        raise
    status = 0
    try:
        path = own.path_for(cluster.scheduler_address)
        cluster.write_scheduler_file(path)
        announce(f"apportion ssh: scheduler at {cluster.scheduler_address}")
        announce(
            f"scheduler file (address, secret and TLS credentials): {path}; "
            f"connect with Client(scheduler_file={str(path)!r})"
        )
        own.announce_spare()
        stopped_by = _wait(stop)
        if stopped_by is None:
            status = 1  # the scheduler ended on its own
    except OSError as exc:
        announce(f"Error: cannot write the scheduler file: {exc}", logging.ERROR)
        status = 1
    finally:
        announce("apportion ssh: stopping the workers, then the scheduler")
        cluster.close()
        own.release(cluster.scheduler_id)
    sys.exit(status)


def _hosts(hostfile: Path | None, hosts: tuple[str, ...]) -> list[str]:
    names = read_hostfile(hostfile.read_text(), str(hostfile)) if hostfile else []
    for text in hosts:
        names.extend(expand_nodelist(text))
    if not names:
        raise ValueError("name the hosts: apportion ssh HOST... or --hostfile FILE")
    return names


def _start(
    names: list[str],
    options: tuple[str, ...],
    nworkers: int,
    nthreads: int | None,
    resources: str | None,
    remote_python: str | None,
    port: int,
    timeout: float,
    stop: threading.Event,
) -> SSHCluster:
    try:
        return SSHCluster(
            names,
            connect_options={"options": options},
            worker_options={"nworkers": nworkers, "nthreads": nthreads, "resources": resources},
            scheduler_options={"port": port},
            remote_python=remote_python,
            timeout=timeout,
            on_scheduler_exit=stop.set,
        )
    except (ValueError, RuntimeError, TimeoutError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def _wait(stop: threading.Event) -> int | None:
    """Wait for SIGINT or SIGTERM (its number) or the scheduler's end (None)."""
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    stop.wait()
    # A second Ctrl-C while stopping is not a KeyboardInterrupt halfway through close():
    # every remote process stops with its ssh connection anyway.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    return received[0] if received else None
