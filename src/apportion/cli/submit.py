"""``apportion submit``: queue runs on a running scheduler, which may be on another host.

The runs go over the connection (``SubmitRuns``) into the scheduler's journal, so
nothing here needs the scheduler's filesystem; ``--wait`` follows them the same way.
"""

from __future__ import annotations

import click

from apportion.cli.credentials import scheduler_address as resolve_address
from apportion.cli.credentials import scheduler_file_option
from apportion.cli.errors import check_address, fail
from apportion.cli.follow import follow
from apportion.cli.run_options import (
    RUN_CONTEXT_SETTINGS,
    RunOptions,
    run_options,
    specs_from_options,
)
from apportion.runs import remote
from apportion.runs.spec import RunSpec, format_array


class AddressFirst(click.Command):
    """Takes a leading ``ADDRESS`` before the run options, as ``submit ADDR --resources ...``.

    The run options stop at the first word that is not one of them (so that the
    command keeps its own options); the address is therefore taken off first.
    """

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[ADDRESS]", *super().collect_usage_pieces(ctx)]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and _is_address(args[0]):
            ctx.meta["address"] = args[0]
            args = args[1:]
        return super().parse_args(ctx, args)


#: Stands for the leading ADDRESS in error messages (it is not a declared parameter).
ADDRESS_ARGUMENT = click.Argument(["address"])


def _is_address(word: str) -> bool:
    """Whether a leading word is meant as the scheduler's address (checked later).

    ``host:port`` with a bad port (``host:abc``) counts, so that it is refused as an
    address rather than run as a command; a command word has no ``:`` before a ``/``.
    """
    if "://" in word:
        return True
    host, colon, _ = word.partition(":")
    return bool(colon) and "/" not in host and "=" not in word and " " not in word


@click.command("submit", cls=AddressFirst, context_settings=RUN_CONTEXT_SETTINGS)
@scheduler_file_option
@click.option(
    "--scheduler",
    "scheduler_address",
    metavar="ADDRESS",
    callback=check_address,
    help="Scheduler address (may also come first: apportion submit ADDRESS ...)  "
    "[default: the one --scheduler-file names, else $APPORTION_SCHEDULER, else your "
    "own running scheduler, found through $APPORTION_HOME/scheduler.json].",
)
@click.option(
    "--wait", is_flag=True, help="Show progress until the runs finish; exit 1 if any failed."
)
@run_options
@click.pass_context
def submit(ctx: click.Context, run: RunOptions, scheduler_address: str | None, wait: bool) -> None:
    """Queue runs of COMMAND on a running scheduler, where its --resources are free.

    \b
      apportion submit tcp://10.0.0.5:8786 --resources gpu=1 -- python train.py
      apportion submit --name sweep --array 1-20 --wait -- python train.py --seed {}

    The command runs in the current directory with the current environment, as
    captured now. Prints the ids given to the runs, and says at once (stderr) if no
    connected worker could ever run them: they stay queued for one that can join,
    and --wait exits 1 instead of waiting. A resource name that is a slip of one the
    workers offer (gpu for GPU) is refused with "did you mean ...?" (status 1).
    """
    address = ctx.meta.get("address", scheduler_address)
    if "address" in ctx.meta:
        check_address(ctx, ADDRESS_ARGUMENT, address)
    try:
        specs = specs_from_options(run)
    except ValueError as error:
        fail(ctx, str(error))
    address = resolve_address(ctx, address)
    try:
        submitted = remote.submit(address, specs)
    except remote.RemoteQueueError as error:
        fail(ctx, str(error), 1)
    ids = submitted.ids
    label = f" ({run.name})" if run.name else ""
    if len(ids) == 1:
        click.echo(f"submitted run {ids[0]}{label} to {address}")
    else:
        click.echo(f"submitted {len(ids)} runs {format_array(ids)}{label} to {address}")
    stuck = _say_verdicts(address, specs, submitted)
    if wait and stuck:
        # Waiting would be waiting for a worker nobody said is coming: say so and stop.
        fail(
            ctx,
            f"not waiting: {_runs_text(stuck)} can never start on the connected workers "
            f"and {'stays' if len(stuck) == 1 else 'stay'} queued; cancel with "
            f"apportion cancel {format_array(stuck)} --scheduler {address}",
            1,
        )
    if wait:
        try:
            status = follow(address, ids)
        except KeyboardInterrupt:
            # Ctrl-C stops the watching, not the runs: say so, and how to stop them too.
            click.echo(
                f"\ninterrupted: {_runs_go_on(ids)}; cancel with "
                f"apportion cancel {format_array(ids)} --scheduler {address}",
                err=True,
            )
            status = INTERRUPTED
        ctx.exit(status)


def _say_verdicts(address: str, specs: list[RunSpec], submitted: remote.Submitted) -> list[int]:
    """Tell on stderr what the connected workers make of the runs' requests; the runs
    none of them can ever run."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for run_id, spec, (kind, text) in zip(submitted.ids, specs, submitted.verdicts, strict=True):
        if kind:
            groups.setdefault((kind, text, spec.resources), []).append(run_id)
    stuck: list[int] = []
    for (kind, text, resources), ids in groups.items():
        runs = _runs_text(ids)
        if kind == "no workers":
            line = f"note: no worker is connected to {address} yet: {runs} will wait for one"
        else:
            stuck += ids
            line = (
                f"warning: {runs} {'asks' if len(ids) == 1 else 'ask'} for {resources}, "
                f"but {text}; queued until a worker that can run "
                f"{'it' if len(ids) == 1 else 'them'} joins"
            )
        click.echo(line, err=True)
    return sorted(stuck)


def _runs_text(ids: list[int]) -> str:
    return f"run {ids[0]}" if len(ids) == 1 else f"runs {format_array(ids)}"


#: The shell's status for a command ended by SIGINT (128 + 2).
INTERRUPTED = 130


def _runs_go_on(ids: list[int]) -> str:
    return f"{_runs_text(ids)} {'goes' if len(ids) == 1 else 'go'} on"
