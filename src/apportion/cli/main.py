"""The ``apportion`` command. Each subcommand's body lives in its own module.

A subcommand's module loads only when that subcommand runs (or its help is asked
for): a worker process starts as ``apportion worker`` and should not pay for the
scheduler's, the job queue's or the batch systems' commands, nor ``--help`` for any.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import click

from apportion.home import PrivateFileError


class Subcommand(NamedTuple):
    """Where a subcommand lives, and what ``apportion --help`` says of it unloaded."""

    #: The module that defines it.
    module: str
    #: Its ``click.Command`` there.
    attribute: str
    #: The first paragraph of its help (``tests/cli`` checks it against the command's).
    summary: str


#: Every subcommand, by name.
SUBCOMMANDS: dict[str, Subcommand] = {
    "alloc": Subcommand(
        "apportion.cli.alloc",
        "alloc",
        "Grow a running cluster through a batch system as its waiting work needs.",
    ),
    "cancel": Subcommand(
        "apportion.cli.runs", "cancel", "Cancel runs: IDS such as 7, 3-5 or 2,4,9."
    ),
    "dump": Subcommand(
        "apportion.cli.inspect",
        "dump",
        "Write the scheduler's whole state to FILENAME as JSON (.json added unless there),"
        " for a bug report.",
    ),
    "info": Subcommand(
        "apportion.cli.inspect",
        "info",
        "Show the workers, their threads and resource pools (total and free now).",
    ),
    "logs": Subcommand(
        "apportion.cli.runs",
        "logs",
        "Print the output of run ID: its stdout and stderr, every attempt, as written.",
    ),
    "runs": Subcommand(
        "apportion.cli.runs",
        "runs",
        "List the runs in the journal, or follow their progress with --watch.",
    ),
    "scheduler": Subcommand(
        "apportion.cli.scheduler",
        "scheduler",
        "Run a scheduler that workers and clients connect to.",
    ),
    "sge": Subcommand(
        "apportion.cli.sge",
        "sge",
        "Run COMMAND with a cluster on the hosts of a Grid Engine job, then stop the cluster.",
    ),
    "slurm": Subcommand(
        "apportion.cli.slurm",
        "slurm",
        "Run COMMAND with a cluster on this Slurm allocation, then stop the cluster.",
    ),
    "ssh": Subcommand(
        "apportion.cli.ssh",
        "ssh",
        "Start a cluster over ssh: the scheduler on the first host, workers on the others"
        " (name a host twice for both), until Ctrl-C stops it (workers drain first).",
    ),
    "stage": Subcommand(
        "apportion.cli.runs",
        "stage",
        "Write runs of COMMAND into the journal without starting them.",
    ),
    "status": Subcommand(
        "apportion.cli.status",
        "status",
        "Show the cluster: workers and their pools (each unit and the task holding it),"
        " task groups, runs, what waits and why (requests no worker can ever meet first),"
        " and the latest warnings.",
    ),
    "submit": Subcommand(
        "apportion.cli.submit",
        "submit",
        "Queue runs of COMMAND on a running scheduler, where its --resources are free.",
    ),
    "token": Subcommand(
        "apportion.cli.credentials",
        "token",
        "Print this account's cluster secret ($APPORTION_HOME/secret), made if need be.",
    ),
    "user": Subcommand(
        "apportion.cli.user",
        "user",
        "Admit people to this cluster, list them, remove them (docs/security.md).",
    ),
    "why": Subcommand(
        "apportion.cli.inspect",
        "why",
        "Say why tasks or runs are not running; with no KEYS, every task still waiting.",
    ),
    "worker": Subcommand(
        "apportion.cli.worker",
        "worker",
        "Run a worker connected to the scheduler at SCHEDULER_ADDRESS, else the one"
        " --scheduler-file names, else $APPORTION_SCHEDULER, else your own running"
        " scheduler, found through $APPORTION_HOME/scheduler.json (waited for up to"
        " --connect-timeout).",
    ),
}


class _Commands(click.Group):
    """The subcommands, loaded by name when one runs, with an unsafe home or private
    file said in one line by all."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(SUBCOMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            where = SUBCOMMANDS[cmd_name]
            command = getattr(importlib.import_module(where.module), where.attribute)
            assert isinstance(command, click.Command), where
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click's, from each unloaded command's summary: the same text, shortened
        by click alike, without loading every module."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name) or click.Command(name, help=SUBCOMMANDS[name].summary)
            if not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in rows])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PrivateFileError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Commands)
@click.version_option(package_name="apportion")
def main() -> None:
    """apportion: run tasks where the resources they need are free."""


if __name__ == "__main__":
    main()
