"""``apportion user add | list | remove``: the people the cluster's owner admits.

Each asks the running scheduler (as ``apportion status`` does) with the owner's
credentials; a person's credential is refused in one line. ``add`` writes the new
person's credential file: a scheduler file (``net/scheduler_file.py``) whose token
speaks for them (``net/person_token.py``), mode 0600, for the owner to hand over.
Given it as ``--scheduler-file`` (or ``APPORTION_SCHEDULER_FILE``, or
``Client(scheduler_file=...)``), every command and client acts as that person.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import TypeVar

import click

from apportion.cli.credentials import scheduler_address, scheduler_file_option, scheduler_option
from apportion.core.people import check_person_name, check_weight, parse_quota
from apportion.core.resources import describe_spec
from apportion.net.connection import ConnectionClosed
from apportion.net.handshake import HandshakeError, open_connection
from apportion.net.scheduler_file import write_scheduler_file
from apportion.net.security import AuthenticationError, security_for
from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError
from apportion.protocol.people import (
    AddPerson,
    ListPeople,
    NotPermitted,
    PeopleListed,
    PersonAdded,
    PersonRemoved,
    RemovePerson,
)
from apportion.protocol.services import Unserved
from apportion.runs.messages import CancelPersonRuns, RunsReport

#: Seconds to reach the scheduler and hear its answer.
TIMEOUT = 30.0

_ids = itertools.count(1)

R = TypeVar("R", bound=Message)


@click.group("user")
def user() -> None:
    """Admit people to this cluster, list them, remove them (docs/security.md).

    Everyone admitted runs code as the workers' Unix user: admit only people who
    may trust each other; people who must not need separate clusters."""


def _check(check: object) -> object:
    def callback(ctx: click.Context, param: click.Parameter, value: object) -> object:
        try:
            return check(value)  # type: ignore[operator]
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return callback


@user.command("add")
@click.argument("name", callback=_check(check_person_name))
@click.option(
    "--weight",
    default="1",
    show_default=True,
    callback=_check(check_weight),
    help="Their share's weight: a person of weight 2 gets twice the share of one of 1.",
)
@click.option(
    "--quota",
    default="",
    metavar="SPEC",
    callback=_check(lambda text: (parse_quota(text), text)[1]),
    help='The most they may hold at once, e.g. "gpu=2 memory=200GiB"  [default: no cap].',
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write their credential file  [default: ./apportion-NAME.json].",
)
@scheduler_option
@scheduler_file_option
@click.pass_context
def add(
    ctx: click.Context,
    name: str,
    weight: float,
    quota: str,
    output: Path | None,
    address: str | None,
) -> None:
    """Admit NAME and write their credential file (mode 0600) to hand to them.

    They connect with it as with a scheduler file: `apportion submit
    --scheduler-file FILE ...`, APPORTION_SCHEDULER_FILE=FILE, or
    Client(scheduler_file=FILE)."""
    path = output or Path(f"apportion-{name}.json")
    if path.exists():
        raise click.ClickException(f"{path} exists already: remove it or give --output")
    address = scheduler_address(ctx, address)
    reply = _ask(address, AddPerson(next(_ids), name, weight, quota), PersonAdded)
    if reply.error:
        raise click.ClickException(reply.error)
    try:
        write_scheduler_file(path, address, reply.token, f"person-{name}", pid=0)
    except OSError as exc:
        raise click.ClickException(
            f"{name} was admitted, but their credential could not be written to {path}: "
            f"{exc}; `apportion user remove {name}` and add them again"
        ) from None
    kept = f"kept in {reply.stored}" if reply.stored else "kept in memory only: lost on restart"
    click.echo(f"admitted {name} ({kept})")
    click.echo(f"wrote {name}'s credential to {path} (mode 0600): give it to {name} alone")


@user.command("list")
@scheduler_option
@scheduler_file_option
@click.pass_context
def list_(ctx: click.Context, address: str | None) -> None:
    """The people admitted: name, weight, quota and clients connected now."""
    address = scheduler_address(ctx, address)
    reply = _ask(address, ListPeople(next(_ids)), PeopleListed)
    if not reply.people:
        click.echo("nobody is admitted: only the owner uses this cluster")
        return
    click.echo(f"{'NAME':<20} {'WEIGHT':>6}  {'CLIENTS':>7}  QUOTA")
    for row in reply.people:
        quota = describe_spec(row["quota"]) if row.get("quota") else "-"
        click.echo(f"{row['name']:<20} {row['weight']:>6g}  {row['clients']:>7}  {quota}")


@user.command("remove")
@click.argument("name")
@scheduler_option
@scheduler_file_option
@click.pass_context
def remove(ctx: click.Context, name: str, address: str | None) -> None:
    """Remove NAME: their credential stops working, their clients are disconnected,
    their tasks and runs not finished are cancelled (running runs are stopped;
    running Python tasks end on their own, their results dropped)."""
    address = scheduler_address(ctx, address)
    reply = _ask(address, RemovePerson(next(_ids), name), PersonRemoved)
    if reply.error:
        raise click.ClickException(reply.error)
    runs = _ask(address, CancelPersonRuns(next(_ids), name), RunsReport)
    click.echo(
        f"removed {name}: {reply.disconnected} clients disconnected, {reply.cancelled} "
        f"tasks and {len(runs.runs)} runs cancelled"
    )


def _ask(address: str, request: Message, kind: type[R]) -> R:
    """``request``'s answer of type ``kind``; any failure is one ``Error:`` line."""
    try:
        answer = asyncio.run(_exchange(address, request))
    except (OSError, HandshakeError, AuthenticationError) as exc:
        raise click.ClickException(f"cannot reach the scheduler at {address}: {exc}") from None
    except (ConnectionClosed, ProtocolError) as exc:
        raise click.ClickException(f"the scheduler at {address} went away: {exc}") from None
    if isinstance(answer, NotPermitted):
        raise click.ClickException(answer.reason)
    if isinstance(answer, Unserved):
        if kind is RunsReport:  # no job queue: no runs to cancel
            return kind(getattr(request, "request_id", 0), [])  # type: ignore[call-arg]
        raise click.ClickException(f"the scheduler at {address} does not serve {answer.kind}")
    if not isinstance(answer, kind):
        raise click.ClickException(f"the scheduler at {address} answered {answer!r:.80}")
    return answer


async def _exchange(address: str, request: Message) -> Message:
    conn, _ = await open_connection(address, "client", "user", security=security_for(address))
    try:
        conn.send(request)
        wanted = getattr(request, "request_id", None)
        while True:
            for reply in await asyncio.wait_for(conn.recv(), TIMEOUT):
                if isinstance(reply, Unserved) or getattr(reply, "request_id", None) == wanted:
                    return reply
    finally:
        conn.abort()
