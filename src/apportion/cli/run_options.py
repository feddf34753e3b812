"""The options of a run, as ``apportion stage`` and ``apportion submit`` both take them.

One decorator (``run_options``) adds them and the ``COMMAND`` argument and hands the
command a ``RunOptions``; ``specs_from_options`` checks them and builds the specs,
so that staging and submitting accept the same options and refuse the same mistakes.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from apportion.cli.errors import fail
from apportion.runs.spec import (
    RunSpec,
    expand_array,
    new_spec,
    parse_array,
    parse_run_resources,
    parse_time_limit,
)

R = TypeVar("R")

#: Context settings a command using ``run_options`` needs: everything from the first
#: argument that is not one of its own options on is the run's command, options and
#: all, so ``stage python train.py --name x`` runs ``train.py --name x``.
RUN_CONTEXT_SETTINGS: dict[str, Any] = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
}


@dataclass(frozen=True, slots=True)
class RunOptions:
    """The run options as given on the command line; ``specs_from_options`` checks them."""

    #: The argv after ``--``; may be empty (refused by ``specs_from_options``).
    command: tuple[str, ...]
    #: Each ``--resources`` text, merged by ``parse_run_resources``.
    resources: tuple[str, ...] = ()
    name: str = ""
    priority: int = 0
    retries: int = 0
    #: ``--time-limit`` text (``"1h30m"``), or None for no limit.
    time_limit: str | None = None
    #: ``--array`` text (``"1-20"``), or None for a lone run.
    array: str | None = None
    #: ``--cwd``, or None for the current directory.
    cwd: str | None = None
    #: ``--preemptible``: the scheduler may stop the runs and start them again.
    preemptible: bool = False


def _integer(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Parse an integer option ourselves: click's own error comes with a usage banner."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        fail(ctx, f"{param.opts[0]}: {value!r} is not an integer")


_RUN_PARAMETERS: tuple[Callable[[Callable[..., Any]], Callable[..., Any]], ...] = (
    click.option(
        "--resources",
        multiple=True,
        metavar="TEXT",
        help="What each run needs, e.g. 'gpu=1 mem=4GiB'; may be given several times "
        "(a name at most once in all).",
    ),
    click.option("--name", default="", help="A label for the runs (an array's elements share it)."),
    click.option(
        "--priority",
        default="0",
        metavar="INT",
        callback=_integer,
        help="Higher starts earlier among runs that could start.  [default: 0]",
    ),
    click.option(
        "--retries",
        default="0",
        metavar="INT",
        callback=_integer,
        help="Start a run again this many times after a failed exit.  [default: 0]",
    ),
    click.option(
        "--time-limit",
        metavar="DURATION",
        help="Stop a run that takes longer: 90, 10m, 1h30m, 1d.  [default: none]",
    ),
    click.option(
        "--array",
        metavar="INDICES",
        help="One run per index (1-20, 1,3,5, 0-10:2); {} in the command becomes the "
        "index, which is also in $APPORTION_ARRAY_INDEX.",
    ),
    click.option(
        "--cwd",
        metavar="DIR",
        help="Directory the runs start in.  [default: the current directory]",
    ),
    click.option(
        "--preemptible",
        is_flag=True,
        help="The scheduler may stop a run (SIGTERM, its worker's grace, SIGKILL) and "
        "queue it again, to let in someone kept below their fair share for the "
        "scheduler's --preempt-after; the log is kept and no retry is used. Write such runs to "
        "resume from a checkpoint.",
    ),
    click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] COMMAND [ARGS]..."),
)


def run_options(func: Callable[..., R]) -> Callable[..., R]:
    """Add the run options and the ``COMMAND`` argument; ``func`` receives ``run: RunOptions``.

    The command using it needs ``context_settings=RUN_CONTEXT_SETTINGS``.
    """

    @functools.wraps(func)
    def with_run(*args: Any, **kwargs: Any) -> R:
        run = RunOptions(
            command=tuple(kwargs.pop("command")),
            resources=tuple(kwargs.pop("resources")),
            name=kwargs.pop("name"),
            priority=kwargs.pop("priority"),
            retries=kwargs.pop("retries"),
            time_limit=kwargs.pop("time_limit"),
            array=kwargs.pop("array"),
            cwd=kwargs.pop("cwd"),
            preemptible=kwargs.pop("preemptible"),
        )
        return func(*args, run=run, **kwargs)

    decorated: Callable[..., R] = with_run
    # Applied last to first, so that --help lists them in the order above.
    for parameter in reversed(_RUN_PARAMETERS):
        decorated = parameter(decorated)
    return decorated


def specs_from_options(run: RunOptions, *, env: Mapping[str, str] | None = None) -> list[RunSpec]:
    """The specs the options ask for: one, or one per ``--array`` index.

    The environment (``env``, default this process's) and the working directory are
    captured now. Raises ``ValueError`` with a one-line message naming the bad option;
    nothing is half-built, so a caller staging the result stages all or nothing.
    """
    if not run.command:
        raise ValueError("no command: give it after the options, e.g. -- python train.py")
    if run.command[0].startswith("-"):
        # Options we do not know end our own (RUN_CONTEXT_SETTINGS), so a mistyped
        # one lands here; no program is named like an option.
        raise ValueError(f"unknown option {run.command[0]!r} (the command to run comes after --)")
    if run.cwd is not None and not os.path.isdir(run.cwd):
        raise ValueError(f"--cwd {run.cwd!r} is not a directory")
    try:
        resources = parse_run_resources(run.resources)  # once: the spec takes it as it is
    except ValueError as error:
        raise ValueError(f"--resources: {error}") from None
    time_limit = None if run.time_limit is None else parse_time_limit(run.time_limit)
    indices = None if run.array is None else parse_array(run.array)
    spec = new_spec(
        run.command,
        cwd=run.cwd,
        env=env,
        resources=resources,
        name=run.name,
        priority=run.priority,
        retries=run.retries,
        time_limit=time_limit,
        preemptible=run.preemptible,
    )
    return [spec] if indices is None else expand_array(spec, indices)
