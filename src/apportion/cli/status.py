"""``apportion status``: the cluster in a terminal, once or redrawn with ``--watch``.

The scheduler gives its status (``scheduler/status.py``); the job queue's runs come
from the journal here, and only when the scheduler asked serves that journal (or
``--journal`` names it), so the runs shown are never another scheduler's. The
lines are drawn by ``status_view``; this module asks, reads and writes.

A watch that loses its scheduler says so in one line and keeps asking, as
``watch(1)`` keeps running its command: the scheduler may be restarting. Ctrl-C
ends it with status 0.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from apportion.cli.credentials import scheduler_address as resolve_address
from apportion.cli.credentials import scheduler_file_option, scheduler_option
from apportion.cli.errors import check_address, fail
from apportion.cli.inspect import connect
from apportion.cli.status_view import MAX_WARNINGS, Style, fit_height, render
from apportion.client.client import Client
from apportion.net.security import AuthenticationError
from apportion.runs.journal import Journal, JournalError, default_journal_path
from apportion.runs.run_states import FINISHED

#: The glyphs a terminal must be able to encode to get ``■□…`` rather than ``#-...``.
_GLYPHS = "■□…"
#: Move home, clear from the cursor to the end of the screen; show and hide the cursor.
_HOME, _CLEAR_LINE, _CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
_HIDE_CURSOR, _SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def _positive(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not value > 0:
        fail(ctx, f"--interval: {value:g} is not a positive number of seconds")
    return value


@click.command("status")
@click.argument("scheduler_address", metavar="[ADDRESS]", required=False, callback=check_address)
@scheduler_option
@scheduler_file_option
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option(
    "--interval",
    type=float,
    default=1.0,
    show_default=True,
    callback=_positive,
    help="Seconds between two redraws of --watch.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document (the scheduler's status and 'runs'); one per line with --watch.",
)
@click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Show the runs of this journal  [default: $APPORTION_HOME/runs.db, when the "
    "scheduler asked serves it].",
)
@click.option("--link", is_flag=True, help="Print a one-time login link to the dashboard.")
@click.pass_context
def status(
    ctx: click.Context,
    scheduler_address: str | None,
    address: str | None,
    watch: bool,
    interval: float,
    as_json: bool,
    journal_path: Path | None,
    link: bool,
) -> None:
    """Show the cluster: workers and their pools (each unit and the task holding it),
    task groups, runs, what waits and why (requests no worker can ever meet first),
    and the latest warnings.

    ADDRESS defaults to --scheduler, else the scheduler --scheduler-file names, else
    $APPORTION_SCHEDULER, else your own running scheduler (found through
    $APPORTION_HOME/scheduler.json). --watch redraws in place until Ctrl-C; a lost
    scheduler is said in one line and asked again. --json prints the status as data
    (docs/status.md lists its keys).
    """
    if scheduler_address is not None:
        if ctx.get_parameter_source("address") is ParameterSource.COMMANDLINE:
            fail(ctx, "give the scheduler's address once: as ADDRESS or --scheduler")
        address = scheduler_address
    address = resolve_address(ctx, address)
    if link:
        if watch or as_json:
            fail(ctx, "--link prints a login link: it does not go with --watch or --json")
        _print_link(address)
        return
    with _runs_source(ctx, journal_path) as runs:
        if watch:
            _watch(address, interval, as_json, runs)
        else:
            with connect(address) as client:
                _once(client, address, as_json, runs)


def _print_link(address: str) -> None:
    with connect(address) as client:
        link = client.dashboard_link
    if link is None:
        raise click.ClickException(f"the scheduler at {address} serves no dashboard")
    click.echo(link)


def _once(client: Client, address: str, as_json: bool, runs: RunsSource) -> None:
    # Text shows no executions: ask for none of the (up to 5,000) the stream keeps.
    found = client.cluster_status() if as_json else client.cluster_status(stream_limit=0)
    shown = runs.read({address, found["scheduler"].get("address", "")})
    if as_json:
        click.echo(json.dumps({**found, "runs": shown}))
    else:
        click.echo("\n".join(render(found, shown, style=_style())))


# --- the runs of the journal --------------------------------------------------------


class RunsSource:
    """The journal whose runs ``status`` shows, if any; opened once for a watch."""

    def __init__(self, journal: Journal | None, explicit: bool) -> None:
        self.journal = journal
        #: Named with --journal: shown whichever scheduler serves it.
        self.explicit = explicit

    def read(self, addresses: set[str]) -> dict[str, Any] | None:
        """``{"journal", "counts", "arrays"}`` (the ``runs`` of the JSON), or None when
        there is no journal or a scheduler at none of ``addresses`` serves it."""
        journal = self.journal
        if journal is None:
            return None
        if not self.explicit:
            owner = journal.owner()
            if owner is None or owner[1] not in addresses:
                return None
        try:
            counts = journal.counts()
            arrays = journal.arrays(MAX_ARRAYS)
        except sqlite3.Error as exc:  # "database is locked" after the busy timeout, say
            raise click.ClickException(f"journal {journal.path}: {exc}") from None
        return {
            "journal": str(journal.path),
            "counts": counts,
            "arrays": [
                {"id": array_id, "name": name, "counts": array}
                for array_id, name, array in arrays
                # The arrays still at work: a finished sweep's bar says nothing new.
                if any(n for state, n in array.items() if state not in FINISHED)
            ],
        }


#: Run arrays looked at, the newest first.
MAX_ARRAYS = 50


@contextmanager
def _runs_source(ctx: click.Context, given: Path | None) -> Iterator[RunsSource]:
    path = given or default_journal_path()
    if not path.exists():
        if given is not None:  # a typo must not look like "no runs"
            fail(ctx, f"no journal at {path}")
        yield RunsSource(None, False)
        return
    try:
        journal = Journal(path)
    except (JournalError, sqlite3.Error, OSError) as exc:
        fail(ctx, f"journal {path}: {exc}", 1)
    with journal:
        yield RunsSource(journal, given is not None)


# --- the terminal -------------------------------------------------------------------


def _style() -> Style:
    """Colour only on a terminal and never under NO_COLOR; cut to the terminal's width,
    or to $COLUMNS (if set) when the output goes to a file or a pipe."""
    tty = sys.stdout.isatty()
    if tty:
        width = shutil.get_terminal_size().columns
    else:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else sys.maxsize
    encoding = sys.stdout.encoding or "ascii"
    try:
        _GLYPHS.encode(encoding)
        unicode = True
    except (UnicodeEncodeError, LookupError):
        unicode = False
    colour = tty and not os.environ.get("NO_COLOR")
    return Style(width=width, colour=colour, unicode=unicode)


def _draw(lines: Sequence[str], tty: bool) -> None:
    """One frame: over the last in place on a terminal, else after it."""
    if not tty:
        click.echo("\n".join([*lines, ""]))
        return
    rows = shutil.get_terminal_size().lines
    fitted = fit_height(lines, rows - 1)
    sys.stdout.write(_HOME + "".join(line + _CLEAR_LINE + "\n" for line in fitted) + _CLEAR_BELOW)
    sys.stdout.flush()


# --- watching -----------------------------------------------------------------------


class _Watch:
    """What a watch remembers between refreshes: the numbers last seen, the warnings."""

    def __init__(self) -> None:
        self.stream_seq = 0
        self.events_seq = 0
        #: The scheduler's clock at the last status; None before the first.
        self.now: float | None = None
        self.warnings: deque[list[Any]] = deque(maxlen=MAX_WARNINGS)

    def reset(self) -> None:
        """Forget everything: a scheduler started again numbers from 0."""
        self.stream_seq = self.events_seq = 0
        self.now = None
        self.warnings.clear()

    def take(self, found: dict[str, Any]) -> float | None:
        """Note a status; the executions per second since the last one, if known."""
        if found["stream"]["seq"] < self.stream_seq or found["events"]["seq"] < self.events_seq:
            self.reset()
        rate = None
        if self.now is not None and found["now"] > self.now:
            rate = (found["stream"]["seq"] - self.stream_seq) / (found["now"] - self.now)
        self.stream_seq, self.events_seq = found["stream"]["seq"], found["events"]["seq"]
        self.now = found["now"]
        self.warnings.extend(found["events"]["items"])
        return rate


def _watch(address: str, interval: float, as_json: bool, runs: RunsSource) -> None:
    """Redraw until Ctrl-C; a lost scheduler is one line, then asked again each turn."""
    tty = sys.stdout.isatty() and not as_json
    client: Client | None = connect(address)  # a first failure ends the command
    seen = _Watch()
    lost = False
    # The watch says itself, once, that it lost the scheduler: without a handler of
    # its own the client's log line would reach stderr too, at every reconnection.
    quiet = logging.NullHandler()
    logging.getLogger("apportion.client").addHandler(quiet)
    if tty:
        sys.stdout.write(_HIDE_CURSOR)
    try:
        while True:
            try:
                if client is None:
                    client = Client(address, timeout=max(interval, 1.0), wait_for_scheduler=False)
                    seen.reset()
                found = client.cluster_status(
                    seen.stream_seq, seen.events_seq, 5_000 if as_json else 0
                )
            except (OSError, TimeoutError, AuthenticationError) as exc:
                if not lost:
                    click.echo(f"lost the scheduler at {address}: {exc}; retrying", err=True)
                lost = True
                if client is not None:
                    client.close()
                    client = None
                time.sleep(interval)
                continue
            lost = False
            _show(found, address, as_json, runs, seen, interval, tty)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if tty:
            sys.stdout.write(_SHOW_CURSOR + "\n")
            sys.stdout.flush()
        if client is not None:
            client.close()
        logging.getLogger("apportion.client").removeHandler(quiet)


def _show(
    found: dict[str, Any],
    address: str,
    as_json: bool,
    runs: RunsSource,
    seen: _Watch,
    interval: float,
    tty: bool,
) -> None:
    rate = seen.take(found)
    shown = runs.read({address, found["scheduler"].get("address", "")})
    if as_json:
        click.echo(json.dumps({**found, "runs": shown}))
        return
    style = _style()
    lines = render(found, shown, style=style, warnings=list(seen.warnings))
    pace = "" if rate is None else f"{rate:.1f} tasks/s, "
    lines.append(f"{pace}every {interval:g} s; Ctrl-C to stop"[: style.width])
    _draw(lines, tty)
