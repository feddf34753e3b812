"""The options every command that listens or connects takes for its credentials.

``--token``, ``--token-file``, ``--tls-cert``, ``--tls-key``, ``--tls-ca`` and
``--scheduler-file`` are handled before the command's other options and become this
process's environment (``APPORTION_TOKEN``, ``APPORTION_TLS_CERT``, ...), which is
where ``Security.from_environment`` finds them and where the worker processes a
supervisor starts inherit them from. The environment, unlike a command line, is not
readable by other users: ``--token`` itself is visible to every user in ``ps``
while the command runs, so the help steers to ``--token-file`` and the variable.

``scheduler_address`` chooses the scheduler a command talks to: the address given on
its command line, else the one ``--scheduler-file`` (or ``APPORTION_SCHEDULER_FILE``)
names, else ``APPORTION_SCHEDULER``, else the user's own running scheduler, found
through ``$APPORTION_HOME/scheduler.json`` (``net/discovery.py``). Never a fixed port:
on a shared machine ``127.0.0.1:8786`` may be another user's scheduler.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from apportion.cli.errors import check_address, fail
from apportion.home import write_private
from apportion.net import security as sec
from apportion.net.address import parse_address
from apportion.net.discovery import NoScheduler, choose_own
from apportion.net.scheduler_claim import look, own_sightings
from apportion.net.scheduler_file import (
    POLL_INTERVAL,
    SchedulerFile,
    SchedulerFileError,
    SchedulerFileMissing,
    default_scheduler_file,
    read_scheduler_file,
    wait_for_scheduler_file,
)

F = TypeVar("F", bound=Callable[..., Any])

#: The scheduler's address, where none is given on the command line or in a file.
SCHEDULER_ENV = "APPORTION_SCHEDULER"
logger = logging.getLogger("apportion.cli")
#: ``ctx.meta`` key: a token was given on this command line (it beats a scheduler file's).
_GIVEN = "apportion.token-given"
#: ``ctx.meta`` key: the address the scheduler file named.
_FILE_ADDRESS = "apportion.scheduler-file-address"
#: ``ctx.meta`` key: the scheduler file given, as given.
_FILE_PATH = "apportion.scheduler-file-path"
#: ``ctx.meta`` key: a scheduler file not written yet, for a command that waits for it.
_PENDING = "apportion.scheduler-file-pending"


def _to_env(variable: str, *, token: bool = False) -> Callable[..., Any]:
    def store(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None:
            return
        os.environ[variable] = value
        if token:
            ctx.meta[_GIVEN] = True
            # The other way of giving it must not win over the one given here.
            other = sec.TOKEN_FILE_ENV if variable == sec.TOKEN_ENV else sec.TOKEN_ENV
            os.environ.pop(other, None)

    return store


def _scheduler_file(
    waits: bool,
) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def read(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None:
            return
        ctx.meta[_FILE_PATH] = value
        try:
            found = read_scheduler_file(value)
        except SchedulerFileError as exc:
            if waits and isinstance(exc, SchedulerFileMissing):
                ctx.meta[_PENDING] = value  # read by ``scheduler_address``, which may wait
                return
            raise click.BadParameter(str(exc), ctx, param) from None
        _use(ctx, found)

    return read


def _use(ctx: click.Context, found: SchedulerFile) -> None:
    ctx.meta[_FILE_ADDRESS] = found.address
    if found.token is not None and not ctx.meta.get(_GIVEN):
        os.environ[sec.TOKEN_ENV] = found.token
        os.environ.pop(sec.TOKEN_FILE_ENV, None)
    tls = {
        sec.TLS_CA_ENV: found.tls_ca,
        sec.TLS_CERT_ENV: found.tls_cert,
        sec.TLS_KEY_ENV: found.tls_key,
    }
    # A file that carries TLS credentials (``apportion ssh``'s) is all it takes, unless
    # this command was given its own.
    if found.tls_cert and not any(os.environ.get(name) for name in tls):
        os.environ.update({name: value for name, value in tls.items() if value})


def _option(*names: str, callback: Callable[..., Any], **kwargs: Any) -> Callable[[F], F]:
    return click.option(*names, is_eager=True, expose_value=False, callback=callback, **kwargs)


def credential_options(command: F) -> F:
    """``--token``, ``--token-file`` and the TLS files (see the module docstring)."""
    for option in reversed(
        [
            _option(
                "--token",
                metavar="SECRET",
                callback=_to_env(sec.TOKEN_ENV, token=True),
                help="The cluster's secret  [default: $APPORTION_TOKEN, else "
                "$APPORTION_TOKEN_FILE, else $APPORTION_HOME/secret]. Visible to other "
                "users in `ps`: prefer --token-file or APPORTION_TOKEN.",
            ),
            _option(
                "--token-file",
                metavar="FILE",
                callback=_to_env(sec.TOKEN_FILE_ENV, token=True),
                help="A file holding the cluster's secret (mode 0600).",
            ),
            _option(
                "--tls-cert",
                metavar="PEM",
                callback=_to_env(sec.TLS_CERT_ENV),
                help="This process's TLS certificate  [default: $APPORTION_TLS_CERT].",
            ),
            _option(
                "--tls-key",
                metavar="PEM",
                callback=_to_env(sec.TLS_KEY_ENV),
                help="Its private key  [default: $APPORTION_TLS_KEY].",
            ),
            _option(
                "--tls-ca",
                metavar="PEM",
                callback=_to_env(sec.TLS_CA_ENV),
                help="The CA that signs every certificate of the cluster: TLS is then "
                "mutual  [default: $APPORTION_TLS_CA].",
            ),
        ]
    ):
        command = option(command)
    return command


def scheduler_file_option(command: F) -> F:
    """``--scheduler-file F``: connect where the file says, with its secret."""
    return _file_option(command, waits=False)


def waiting_scheduler_file_option(command: F) -> F:
    """``scheduler_file_option`` for a command that waits for a file not written yet
    (``scheduler_address`` with ``wait``): a worker started by the same ``srun`` as its
    scheduler."""
    return _file_option(command, waits=True)


def _file_option(command: F, *, waits: bool) -> F:
    also = " (waited for, up to --connect-timeout, if not written yet)" if waits else ""
    return _option(
        "--scheduler-file",
        metavar="FILE",
        envvar="APPORTION_SCHEDULER_FILE",
        callback=_scheduler_file(waits),
        help="Connect to the scheduler this file names (written by `apportion "
        f"scheduler`), with the secret it holds{also}  [default: "
        "$APPORTION_SCHEDULER_FILE].",
    )(credential_options(command))


def scheduler_file_path(ctx: click.Context) -> str | None:
    """The ``--scheduler-file`` given (or its variable's), if any."""
    path = ctx.meta.get(_FILE_PATH)
    return None if path is None else str(path)


def file_address(ctx: click.Context, given: str | None) -> str | None:
    """The address given on the command line, else the scheduler file's, if any."""
    return given if given is not None else ctx.meta.get(_FILE_ADDRESS)


def scheduler_address(ctx: click.Context, given: str | None, wait: float = 0.0) -> str:
    """The scheduler this command talks to, in the order the module docstring gives;
    ``Error:`` in one line if no scheduler of the user's runs.

    A scheduler file that a waiting command (a worker) found missing, or a default
    file that names no running scheduler yet, is waited for up to ``wait`` seconds:
    the scheduler may be starting beside it.
    """
    pending = ctx.meta.pop(_PENDING, None)
    if pending is not None and given is None:
        try:
            _use(ctx, wait_for_scheduler_file(pending, wait))
        except SchedulerFileError as exc:
            raise click.ClickException(str(exc)) from None
    address = file_address(ctx, given)
    if address is not None:
        return address
    from_env = os.environ.get(SCHEDULER_ENV)
    if from_env:
        try:
            parse_address(from_env)
        except ValueError as exc:
            fail(ctx, f"{SCHEDULER_ENV}: {exc}")
        return from_env
    try:
        found = _own_scheduler(wait)
    except NoScheduler as exc:
        raise click.ClickException(str(exc)) from None
    _use(ctx, found)
    return found.address


def _own_scheduler(wait: float) -> SchedulerFile:
    """The user's running scheduler (``discovery.choose_own``), looked for until
    ``wait`` seconds have passed."""
    default = default_scheduler_file()
    deadline = time.monotonic() + wait
    said = False
    while True:
        sighting = look(default)
        if sighting.usable or sighting.problem is not None or time.monotonic() >= deadline:
            others = [] if sighting.usable else own_sightings(default)[1:]
            return choose_own(sighting, others)
        if not said:
            logger.info("waiting up to %gs for a scheduler of yours to start (%s)", wait, default)
            said = True
        time.sleep(POLL_INTERVAL)


#: ``--scheduler ADDRESS`` of the commands that ask a running scheduler.
scheduler_option = click.option(
    "--scheduler",
    "address",
    metavar="ADDRESS",
    callback=check_address,
    help="Scheduler address  [default: the one --scheduler-file names, else "
    "$APPORTION_SCHEDULER, else your own running scheduler, found through "
    "$APPORTION_HOME/scheduler.json].",
)


@click.command("token")
@click.option(
    "--new",
    is_flag=True,
    help="Replace this account's secret with a fresh one (restart the scheduler and "
    "workers afterwards: connections already open stay open until then).",
)
@click.option(
    "--metrics",
    is_flag=True,
    help="Print the bearer token the dashboard's /metrics accepts instead: it lets "
    "Prometheus read the metrics, and nothing else (docs/metrics.md).",
)
def token(new: bool, metrics: bool) -> None:
    """Print this account's cluster secret ($APPORTION_HOME/secret), made if need be.

    Copy it to the other machines' APPORTION_TOKEN (or a file for --token-file): any
    process that holds it can run code on your workers.

    \b
      export APPORTION_TOKEN=$(apportion token)
      apportion token --metrics > /etc/prometheus/apportion-metrics-token
    """
    try:
        if new:
            write_private(sec.secret_path(), sec.new_token() + "\n")
        secret = sec.user_secret(create=True)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    if new:
        click.echo(f"wrote a new secret to {sec.secret_path()}", err=True)
    if metrics:
        # From the secret a scheduler started here would use: APPORTION_TOKEN first.
        # Here, not at the top: every worker process loads this module, not the dashboard.
        from apportion.dashboard.auth import metrics_token

        click.echo(metrics_token(sec.Security.from_environment().key()))
        return
    click.echo(secret)
