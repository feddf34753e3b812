"""Commands on a local journal of runs: ``stage``, ``runs`` (``show``, ``rm``, ``prune``),
``logs`` and ``cancel``.

They open the journal file directly and need no scheduler: SQLite lets them read and
write while a scheduler serves the same file. What only a scheduler can do (start a
run, stop its processes) they leave in the journal for it, and say so when none serves
the journal now, rather than let a request wait without a word.

The options of a run (``run_options.py``) are shared with ``apportion submit``, so
that staging and submitting accept the same options and refuse the same mistakes.
Errors are one line, ``Error: ...``, with exit status 2 for bad input (a malformed
option, an unknown id) and 1 for a journal that cannot be used.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, tzinfo
from pathlib import Path
from typing import BinaryIO

import click
from click.core import ParameterSource

from apportion.cli.credentials import file_address, scheduler_file_option
from apportion.cli.errors import check_address, fail
from apportion.cli.follow import follow
from apportion.cli.run_options import (
    RUN_CONTEXT_SETTINGS,
    RunOptions,
    run_options,
    specs_from_options,
)
from apportion.core.resources import describe_spec
from apportion.runs import remote
from apportion.runs.journal import (
    FINISHED,
    QUEUED,
    RUNNING,
    STAGED,
    STATES,
    Journal,
    JournalError,
    RunRecord,
    default_journal_path,
    describe_exit,
)
from apportion.runs.spec import (
    format_array,
    format_time_limit,
    parse_array,
    parse_time_limit,
)
from apportion.runs.table import format_run, format_runs, progress_line, summary

#: How often ``logs --follow`` looks for new output and for the run's end, in seconds.
FOLLOW_INTERVAL = 0.2

#: Where ``runs`` leaves its ``--journal`` for its subcommands.
_JOURNAL_META = "apportion.runs.journal"


# --- opening the journal ----------------------------------------------------------------

journal_option = click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The journal file.  [default: $APPORTION_HOME/runs.db, else ~/.apportion/runs.db]",
)


def _journal_path(ctx: click.Context, given: Path | None) -> Path:
    """``--journal`` of the command, else of ``runs`` before a subcommand, else the default."""
    if given is not None:
        return given
    inherited: Path | None = ctx.meta.get(_JOURNAL_META)
    return inherited if inherited is not None else default_journal_path()


@contextmanager
def _opened(ctx: click.Context, path: Path, *, create: bool = False) -> Iterator[Journal]:
    """The journal at ``path``; any failure to use it becomes one ``Error:`` line.

    Only ``stage`` creates a journal: reading a path that does not exist is most
    likely a typo, which an empty new journal would hide.
    """
    if not create and not path.exists():
        fail(ctx, f"no journal at {path} (stage runs there first, or give --journal)")
    try:
        journal = Journal(path)
    except JournalError as error:  # its message names the file
        fail(ctx, str(error), 1)
    except (sqlite3.Error, OSError) as error:  # OSError: its directory cannot be made
        fail(ctx, f"journal {path}: {error}", 1)
    # OSError is not caught from here on: a closed pipe on stdout is not the journal's.
    try:
        with journal:
            yield journal
    except sqlite3.Error as error:  # "database is locked" after the busy timeout, say
        fail(ctx, f"journal {path}: {error}", 1)


def _parse_ids(ctx: click.Context, texts: Iterable[str]) -> list[int]:
    """Run ids from arguments such as ``7``, ``3-5`` or ``2,4,9``; each once, in order."""
    ids: dict[int, None] = {}
    for text in texts:
        try:
            ids.update(dict.fromkeys(parse_array(text)))
        except ValueError:
            fail(ctx, f"invalid run id {text!r}: give ids such as 7, 3-5 or 2,4,9")
    return list(ids)


def _ids_argument(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[int]:
    return _parse_ids(ctx, value)


def _id_argument(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    if not re.fullmatch("[0-9]{1,18}", value):  # int() would also take " +7" and non-ASCII digits
        fail(ctx, f"invalid run id {value!r}: give a number such as 7")
    return int(value)


def _seconds_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_time_limit(value)
    except ValueError as error:
        fail(ctx, f"{param.opts[0]}: {error}")


def _runs_text(ids: Sequence[int]) -> str:
    """``"run 7"``, ``"runs 3-5,9"``."""
    return f"run {ids[0]}" if len(ids) == 1 else f"runs {format_array(sorted(ids))}"


def _owner_text(owner: tuple[int, str]) -> str:
    pid, address = owner
    return f"the scheduler at {address or '?'} (pid {pid or '?'})"


# --- stage ---------------------------------------------------------------------------


@click.command("stage", context_settings=RUN_CONTEXT_SETTINGS)
@run_options
@journal_option
@click.pass_context
def stage(ctx: click.Context, run: RunOptions, journal_path: Path | None) -> None:
    """Write runs of COMMAND into the journal without starting them.

    The command is recorded with the current directory and the whole environment as
    they are now, so it later runs as if started from this shell. Staged runs wait
    until a scheduler serving the journal starts them, each where its --resources are
    free. Put these options before the command, and -- before a command that has
    options of its own:

    \b
      apportion stage --resources gpu=1 -- python train.py --lr 0.1
      apportion stage --name sweep --array 1-20 -- python train.py --seed {}

    Prints the ids given to the runs. A malformed option stages nothing.
    """
    try:
        specs = specs_from_options(run)
    except ValueError as error:
        fail(ctx, str(error))
    with _opened(ctx, _journal_path(ctx, journal_path), create=True) as journal:
        ids = journal.stage(specs, time.time())
    label = f" ({run.name})" if run.name else ""
    if len(ids) == 1:
        click.echo(f"staged run {ids[0]}{label}")
    else:
        click.echo(f"staged {len(ids)} runs {format_array(ids)}{label}")


# --- runs and its subcommands -----------------------------------------------------------

#: Options of ``runs`` that only make sense when it lists (no subcommand).
_LISTING_OPTIONS = ("states", "array_id", "ids", "watch", "interval", "address")


@click.group("runs", invoke_without_command=True)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATES),
    help="Show only runs in this state; may be given several times.",
)
@click.option(
    "--array", "array_id", metavar="ID", callback=_id_argument, help="Only the runs of array ID."
)
@click.option("--ids", metavar="IDS", help="Only these runs: 7, 3-5, 2,4,9.")
@click.option(
    "--watch",
    is_flag=True,
    help="Instead of the table, show progress until no run is queued or running.",
)
@click.option(
    "--interval",
    default="0.5",
    metavar="SECONDS",
    callback=_seconds_option,
    help="How often --watch looks again.  [default: 0.5]",
)
@journal_option
@click.option(
    "--scheduler",
    "address",
    metavar="ADDRESS",
    callback=check_address,
    help="Ask the scheduler at ADDRESS for its runs instead of reading a journal here "
    "(from another machine; the latest 1,000 runs unless --ids or --array).",
)
@scheduler_file_option
@click.pass_context
def runs(
    ctx: click.Context,
    states: tuple[str, ...],
    array_id: int | None,
    ids: str | None,
    watch: bool,
    interval: float,
    journal_path: Path | None,
    address: str | None,
) -> None:
    """List the runs in the journal, or follow their progress with --watch.

    Every run is listed ('runs prune' removes finished ones). RESOURCES is what a
    running run holds, else what it asked for; INFO says how a finished run ended or
    why a waiting one waits.

    --watch redraws one progress line until nothing is queued or running and no
    staged run can still be started, then prints a summary. With --array or --ids
    it watches just those runs. "no scheduler" on the line means none serves the
    journal now, so queued and running runs wait for one to start.

    \b
      apportion runs --state running
      apportion runs --watch --array 8
      apportion runs show 7
    """
    if ctx.invoked_subcommand is not None:
        for param in ctx.command.params:
            if param.name in _LISTING_OPTIONS and (
                ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT
            ):
                fail(ctx, f"{param.opts[0]} lists runs: it does not go with a subcommand")
        ctx.meta[_JOURNAL_META] = journal_path
        return
    if watch and states:
        fail(ctx, "--watch counts runs in every state: it does not go with --state")
    address = file_address(ctx, address)
    if address is not None:
        _remote_runs(ctx, address, states, array_id, ids, watch)
        return
    path = _journal_path(ctx, journal_path)
    if not path.exists() and array_id is None and ids is None:
        # Nothing was ever staged here (the default journal before first use).
        click.echo(f"no runs (no journal at {path} yet)")
        return
    with _opened(ctx, path) as journal:
        selected = _select(ctx, journal, array_id, ids)
        if watch:
            _watch(journal, selected, interval)
        else:
            records = journal.runs(states=set(states) or None, ids=selected)
            click.echo(format_runs(records, time.time()))


def _remote_runs(
    ctx: click.Context,
    address: str,
    states: tuple[str, ...],
    array_id: int | None,
    ids: str | None,
    watch: bool,
) -> None:
    """``runs --scheduler``: the same table, or progress, from a scheduler anywhere."""
    wanted = [] if ids is None else _parse_ids(ctx, [ids])
    try:
        records = remote.query(address, wanted)
    except remote.RemoteQueueError as error:
        fail(ctx, str(error), 1)
    if array_id is not None:
        records = [r for r in records if r.array_id == array_id]
    if states:
        records = [r for r in records if r.state in states]
    if watch:
        ctx.exit(follow(address, [r.id for r in records]) if records else 0)
    click.echo(format_runs(records, time.time()))


def _select(
    ctx: click.Context, journal: Journal, array_id: int | None, ids: str | None
) -> list[int] | None:
    """Ids picked by ``--array`` and ``--ids`` (both: runs in both); None for every run."""
    selected = None if ids is None else _parse_ids(ctx, [ids])
    if array_id is not None:
        members = [r.id for r in journal.runs(array_id=array_id)]
        if not members:
            run = journal.get(array_id)
            if run is not None and run.array_id is not None:
                # An array is named by its first run's id; this is a later element.
                fail(ctx, f"no array {array_id}: run {array_id} is in array {run.array_id}")
            fail(ctx, f"no array {array_id}")
        selected = members if selected is None else sorted(set(members) & set(selected))
    return selected


def _watch(journal: Journal, ids: list[int] | None, interval: float) -> None:
    """Show progress until no run is queued or running and no staged run can start."""
    tty = sys.stdout.isatty()
    shown = ""
    try:
        while True:
            counts = journal.counts(ids)
            owner = journal.owner()
            line = progress_line(counts)
            if owner is None and counts[QUEUED] + counts[RUNNING]:
                # The runs are stuck until a scheduler takes the journal up again.
                line += "  - no scheduler"
            if tty:
                width = shutil.get_terminal_size().columns - 1
                click.echo(f"\r{line[:width]}\x1b[K", nl=False)
            elif line != shown:
                click.echo(line)
            shown = line
            if not counts[QUEUED] + counts[RUNNING] and (not counts[STAGED] or owner is None):
                break
            time.sleep(interval)
    finally:
        if tty:
            click.echo()
    click.echo(summary(counts))
    if counts[STAGED]:
        click.echo(f"{counts[STAGED]} staged: no scheduler serves {journal.path} now to start them")


@runs.command("show", short_help="One run in detail, with its history.")
@click.argument("run_id", metavar="ID", callback=_id_argument)
@journal_option
@click.pass_context
def show(ctx: click.Context, run_id: int, journal_path: Path | None) -> None:
    """Show everything about run ID: its command, resources, limits and history."""
    with _opened(ctx, _journal_path(ctx, journal_path)) as journal:
        record = journal.get(run_id)
        if record is None:
            fail(ctx, f"no run {run_id}")
        click.echo(format_run(record, journal.history(run_id)))


@runs.command("rm", short_help="Remove staged and finished runs.")
@click.argument("run_ids", nargs=-1, metavar="[IDS]...", callback=_ids_argument)
@click.option("--all", "everything", is_flag=True, help="Every staged and finished run.")
@journal_option
@click.pass_context
def rm(ctx: click.Context, run_ids: list[int], everything: bool, journal_path: Path | None) -> None:
    """Remove runs with their history and logs: IDS (7, 3-5, 2,4,9) or --all.

    Staged and finished runs can be removed. Queued and running ones belong to a
    scheduler and are refused: cancel them first. Ids are never reused.
    Exit status 1 if a run was refused, 2 if an id is unknown.
    """
    if everything == bool(run_ids):
        fail(ctx, "give the ids of the runs to remove, or --all (not both)")
    with _opened(ctx, _journal_path(ctx, journal_path)) as journal:
        wanted = None if everything else run_ids
        found = journal.runs(ids=wanted)
        removable = [r.id for r in found if r.state not in (QUEUED, RUNNING)]
        busy = [r.id for r in found if r.state in (QUEUED, RUNNING)]
        unknown = sorted(set(run_ids) - {r.id for r in found})
        try:
            removed = journal.remove(removable)
        except (KeyError, ValueError) as error:
            # A scheduler queued or finished one of them since we looked.
            fail(ctx, f"nothing removed: {error.args[0]}; try again", 1)
    click.echo(f"removed {_runs_text(removed)}" if removed else "removed no runs")
    if busy:
        them = "it" if len(busy) == 1 else "them"
        verb = "left" if everything else "refused"
        click.echo(
            f"{verb} queued or running {_runs_text(busy)}: cancel {them} first "
            f"(apportion cancel {format_array(sorted(busy))})",
            err=not everything,
        )
    if unknown:
        fail(ctx, f"no {_runs_text(unknown)}")
    if busy and not everything:
        ctx.exit(1)


@runs.command("prune", short_help="Remove finished runs, or those that ended long ago.")
@click.option(
    "--older-than",
    metavar="DURATION",
    callback=_seconds_option,
    help="Only runs that ended longer ago than this: 1d, 12h, 90m.  [default: every one]",
)
@journal_option
@click.pass_context
def prune(ctx: click.Context, older_than: float | None, journal_path: Path | None) -> None:
    """Remove finished runs (completed, failed, cancelled, lost) with their logs.

    Staged, queued and running runs are kept.
    """
    with _opened(ctx, _journal_path(ctx, journal_path)) as journal:
        count = journal.prune(older_than=older_than, now=time.time())
    when = "" if older_than is None else f" that ended over {format_time_limit(older_than)} ago"
    noun = "run" if count == 1 else "runs"
    click.echo(f"pruned {count} finished {noun}{when}")


# --- logs and cancel ----------------------------------------------------------------


@click.command("logs")
@click.argument("run_id", metavar="ID", callback=_id_argument)
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new output until the run finishes."
)
@journal_option
@click.pass_context
def logs(ctx: click.Context, run_id: int, follow: bool, journal_path: Path | None) -> None:
    """Print the output of run ID: its stdout and stderr, every attempt, as written.

    With --follow, waits for more until the run has finished and all it wrote is
    printed. A run with no output says why on stderr: one that never started (or has
    not started yet) exits 1 with the reason, one that wrote nothing exits 0.
    """
    out = sys.stdout.buffer
    with _opened(ctx, _journal_path(ctx, journal_path)) as journal:
        record = journal.get(run_id)
        if record is None:
            fail(ctx, f"no run {run_id}")
        # Notes go to stderr, so that stdout stays the log's bytes alone.
        if follow and record.state not in FINISHED and journal.owner() is None:
            click.echo(
                f"note: run {run_id} is {record.state} and no scheduler serves this journal "
                "now; following until one finishes it (Ctrl-C to stop)",
                err=True,
            )
        elif follow and record.started is None and record.state not in FINISHED:
            why = explain_run(record, journal.owner())
            click.echo(f"note: run {run_id} has not started yet ({why}); waiting", err=True)
        try:
            copied = _copy_log(journal, run_id, follow, out)
        except BrokenPipeError:
            # The reader went away (| head): stop quietly, and keep Python from
            # failing again when it flushes stdout at exit.
            _silence_stdout()
            return
        last = journal.get(run_id)
        if copied is None or last is None:
            fail(ctx, f"run {run_id} was removed while its log was being followed", 1)
        if not copied:
            text, status = no_output(last, journal.owner())
            if status:
                fail(ctx, text, status)
            click.echo(text, err=True)


def no_output(record: RunRecord, owner: tuple[int, str] | None) -> tuple[str, int]:
    """Why a run has no output, and the exit status of ``apportion logs``: 1 for a run
    that never started or has not started yet (there is no log to print), 0 for one
    that ran and wrote nothing (its log is empty, and that is its output)."""
    if record.started is None:
        if record.state in FINISHED:
            reason = f" ({record.reason})" if record.reason else ""
            return f"run {record.id} never started, so it has no output: {record.state}{reason}", 1
        why = explain_run(record, owner)
        return f"run {record.id} has not started yet, so it has no output: {why}", 1
    return f"note: run {record.id} has written no output ({explain_run(record, owner)})", 0


def _copy_log(journal: Journal, run_id: int, follow: bool, out: BinaryIO) -> int | None:
    """Copy the log to ``out``, with ``follow`` until the run finishes: the bytes
    copied, or None if the run was removed meanwhile."""
    path = journal.log_path(run_id)
    offset = 0
    while True:
        # The state is read before the file: once the run is seen finished, reading
        # to the end gets everything it wrote.
        record = journal.get(run_id) if follow else None
        try:
            with path.open("rb") as log:
                log.seek(offset)
                shutil.copyfileobj(log, out)
                offset = log.tell()
        except FileNotFoundError:
            pass  # no output yet
        out.flush()
        if not follow:
            return offset
        if record is None:
            return None
        if record.state in FINISHED:
            return offset
        time.sleep(FOLLOW_INTERVAL)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.buffer.fileno())
    except (OSError, ValueError):
        pass  # not a real file descriptor (a test runner's buffer)


@click.command("cancel")
@click.argument("run_ids", nargs=-1, required=True, metavar="IDS...", callback=_ids_argument)
@journal_option
@click.option(
    "--scheduler",
    "address",
    metavar="ADDRESS",
    callback=check_address,
    help="Ask the scheduler at ADDRESS to cancel them (from another machine).",
)
@scheduler_file_option
@click.pass_context
def cancel(
    ctx: click.Context, run_ids: list[int], journal_path: Path | None, address: str | None
) -> None:
    """Cancel runs: IDS such as 7, 3-5 or 2,4,9.

    A staged run is cancelled at once. A queued or running one is marked, and the
    scheduler serving the journal drops it or stops its processes, then frees its
    resources; with no scheduler serving the journal, that happens when one starts.
    Finished runs are left as they are. Exit status 2 if an id is unknown.
    """
    address = file_address(ctx, address)
    if address is not None:
        _remote_cancel(ctx, address, run_ids)
        return
    outcomes: dict[str, list[int]] = {}
    with _opened(ctx, _journal_path(ctx, journal_path)) as journal:
        owner = journal.owner()
        now = time.time()
        with journal.batch():  # one commit however many runs
            for run_id in run_ids:
                try:
                    outcome = journal.request_cancel(run_id, now)
                except KeyError:
                    outcome = "unknown"
                if outcome == "finished":
                    # Say how: "already finished (failed)"; keyed apart from the
                    # "cancelled" of a staged run cancelled just now.
                    record = journal.get(run_id)
                    outcome = f"finished:{record.state if record is not None else '?'}"
                outcomes.setdefault(outcome, []).append(run_id)
    for outcome, ids in outcomes.items():
        if outcome != "unknown":
            click.echo(_cancel_line(outcome, ids, owner))
    if "unknown" in outcomes:
        fail(ctx, f"no {_runs_text(outcomes['unknown'])}")


def _remote_cancel(ctx: click.Context, address: str, run_ids: list[int]) -> None:
    try:
        records = remote.cancel(address, run_ids)
    except remote.RemoteQueueError as error:
        fail(ctx, str(error), 1)
    for record in records:
        if record.state in FINISHED:
            click.echo(f"run {record.label()}: {record.state}")
        else:
            click.echo(
                f"run {record.label()}: cancel requested ({record.state}); the scheduler "
                "stops it and frees its resources once its processes are gone"
            )
    unknown = sorted(set(run_ids) - {record.id for record in records})
    if unknown:
        fail(ctx, f"no {_runs_text(unknown)} at {address}")


def _cancel_line(outcome: str, ids: list[int], owner: tuple[int, str] | None) -> str:
    runs_text = _runs_text(ids)
    if outcome == "cancelled":
        return f"cancelled {runs_text}"
    if outcome == "requested":
        one = len(ids) == 1
        if owner is None:
            return (
                f"cancel requested for {runs_text}: no scheduler serves this journal now; "
                f"{'it is' if one else 'they are'} cancelled when one starts"
            )
        it, its = ("it", "its") if one else ("them", "their")
        return (
            f"cancel requested for {runs_text} (the scheduler stops {it} and frees "
            f"{its} resources once {its} processes are gone)"
        )
    return f"{runs_text} already finished ({outcome.removeprefix('finished:')})"


# --- why a run is not running ---------------------------------------------------------


def explain_run(
    record: RunRecord, owner: tuple[int, str] | None, *, tz: tzinfo | None = None
) -> str:
    """Why one run is not running, or what it is doing, in one line.

    ``owner`` is ``Journal.owner()``: whether a scheduler serves the journal now
    changes the answer, since without one nothing moves. Times are in ``tz`` (None:
    local time).
    """
    if record.state in FINISHED:
        how = describe_exit(record.exit_code, record.signal)
        return (
            f"finished: {record.state}"
            + (f" ({how})" if how else "")
            + (f": {record.reason}" if record.reason else "")
        )
    if record.state == STAGED:
        if record.waiting:
            return f"staged: {record.waiting}"
        if owner is not None:
            return f"staged: {_owner_text(owner)} serves this journal and has not queued it yet"
        return (
            "staged: waiting for a scheduler with this journal to start "
            "(apportion scheduler --run-once or a long-lived one)"
        )
    text = _explain_active(record, tz)
    if record.cancel_requested:
        text = f"cancel requested; {text}"
    if owner is None:
        text += "; no scheduler serves this journal now, so nothing changes until one starts"
    return text


def _explain_active(record: RunRecord, tz: tzinfo | None) -> str:
    """What a queued or running run is doing."""
    if record.state == RUNNING:
        since = datetime.fromtimestamp(record.started or record.created, tz)
        held = f" holding {describe_spec(record.held)}" if record.held else ""
        text = f"running on {record.worker}{held} since {since:%Y-%m-%d %H:%M:%S}"
        if record.preemptions:
            text += (
                f" (attempt {record.attempts}; {record.preemptions} earlier attempts "
                "preempted to let another share in)"
            )
        return text
    if record.waiting:
        text = f"queued: {record.waiting}"
    elif record.spec.resources:
        text = f"queued: waiting for a worker where {describe_spec(record.spec.resources)} are free"
    else:
        text = "queued: waiting for a free worker"
    if record.reason:  # it ran before and was interrupted
        text += f" (after attempt {record.attempts}: {record.reason})"
    return text


#: The commands of this module, for ``apportion``'s group to add.
RUN_COMMANDS: list[click.Command] = [stage, runs, logs, cancel]
