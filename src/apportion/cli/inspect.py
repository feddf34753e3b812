"""``apportion why``, ``info`` and ``dump``: ask a running scheduler.

Given no address, they ask the user's own (``credentials.scheduler_address``).
"""

from __future__ import annotations

from pathlib import Path

import click

from apportion.cli.credentials import scheduler_address, scheduler_file_option, scheduler_option
from apportion.cli.runs import explain_run
from apportion.client.client import Client
from apportion.client.dump_file import dump_path
from apportion.core.resources import SCALE, describe_amount, format_amount
from apportion.net.security import AuthenticationError
from apportion.runs.journal import Journal, default_journal_path
from apportion.scheduler.client_requests import WHY_ALL_LIMIT
from apportion.scheduler.explain import unknown_text


def connect(address: str) -> Client:
    """A client of the scheduler at ``address``; failing to reach it or to prove the
    secret is one ``Error:`` line (status 1), not a traceback. One try: a mistyped
    address fails at once rather than being waited for as a starting scheduler."""
    try:
        return Client(address, timeout=10, wait_for_scheduler=False)
    except (OSError, TimeoutError, AuthenticationError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command("why")
@click.argument("keys", nargs=-1)
@scheduler_option
@scheduler_file_option
@click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="For run ids: the journal file  [default: $APPORTION_HOME/runs.db].",
)
@click.pass_context
def why(
    ctx: click.Context, keys: tuple[str, ...], address: str | None, journal_path: Path | None
) -> None:
    """Say why tasks or runs are not running; with no KEYS, every task still waiting.

    A KEY that is a number is a run id of the job queue (apportion runs), explained
    from the journal; any other KEY is a task key, asked of the scheduler.
    """
    if keys and all(key.isdigit() for key in keys):
        _why_runs([int(key) for key in keys], journal_path or default_journal_path())
        return
    address = scheduler_address(ctx, address)
    with connect(address) as client:
        reasons = client.why(list(keys))
    if not reasons:
        click.echo("no task is waiting: everything submitted is running or done")
    unknown = [key for key, reason in reasons.items() if reason == unknown_text(key)]
    for key, reason in reasons.items():
        if key not in unknown:
            click.echo(f"{key}: {reason}")
    if not keys and len(reasons) >= WHY_ALL_LIMIT:
        click.echo(f"(the first {WHY_ALL_LIMIT} waiting tasks; name keys to ask about others)")
    if unknown:
        # A typo'd key must not look like an answer: a script checking the status sees it.
        names = ", ".join(repr(key) for key in unknown)
        raise click.ClickException(
            f"no task {names} on the scheduler at {address}: never submitted, or already released"
        )


@click.command("info")
@scheduler_option
@scheduler_file_option
@click.pass_context
def info(ctx: click.Context, address: str | None) -> None:
    """Show the workers, their threads and resource pools (total and free now).

    Indexed pools also get a line each with every unit's state, so that the units
    each process holds (--split-units) can be checked at a glance.
    """
    address = scheduler_address(ctx, address)
    with connect(address) as client:
        snapshot = client.scheduler_info()
    workers = snapshot["workers"]
    click.echo(f"scheduler {snapshot.get('address', address)}: {len(workers)} workers")
    tasks = snapshot.get("tasks", {})
    if tasks:
        click.echo("tasks: " + ", ".join(f"{n} {state}" for state, n in sorted(tasks.items())))
    for addr, w in sorted(workers.items(), key=lambda item: item[1]["name"]):
        pools = ", ".join(
            f"{name} {_readable(name, w['free_resources'][name])}/{_readable(name, total)} free"
            for name, total in sorted(w["resources"].items())
        )
        click.echo(
            f"  {w['name']:<16} {addr:<24} {w['nthreads']} threads, "
            f"{w['processing']} tasks, {pools or 'no resources'}"
        )
        for name, units in sorted(w.get("units", {}).items()):
            click.echo(f"    {name} {format_unit_states(units)}")


def format_unit_states(units: dict[str, float]) -> str:
    """Each unit of an indexed pool with what is free of it, in label order.

    [0:free 1:busy 2:0.5]: a number is the free part of a unit shared by fractions.
    """
    return "[" + " ".join(f"{label}:{_unit_state(free)}" for label, free in units.items()) + "]"


def _unit_state(free: float) -> str:
    ticks = round(free * SCALE)
    if ticks >= SCALE:
        return "free"
    if ticks <= 0:
        return "busy"
    return format_amount(ticks)


def _readable(name: str, value: float) -> str:
    """A plain-number amount (as ``scheduler_info()`` gives it) for people to read."""
    return describe_amount(name, round(value * SCALE))


@click.command("dump")
@click.argument("filename", type=click.Path(dir_okay=False, writable=True))
@scheduler_option
@scheduler_file_option
@click.pass_context
def dump(ctx: click.Context, filename: str, address: str | None) -> None:
    """Write the scheduler's whole state to FILENAME as JSON (.json added unless
    there), for a bug report."""
    address = scheduler_address(ctx, address)
    with connect(address) as client:
        state = client.dump_cluster_state(filename, format="json")
    click.echo(
        f"wrote {len(state['task_states'])} tasks and {len(state['workers'])} workers "
        f"to {dump_path(filename, 'json')}"
    )


def _why_runs(ids: list[int], path: Path) -> None:
    if not path.exists():
        raise click.ClickException(f"no journal at {path}")
    with Journal(path) as journal:
        owner = journal.owner()
        for run_id in ids:
            record = journal.get(run_id)
            if record is None:
                raise click.ClickException(f"no run {run_id} in {path}")
            click.echo(f"run {record.label()}: {explain_run(record, owner)}")
