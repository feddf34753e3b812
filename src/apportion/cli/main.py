"""The ``apportion`` command. Each subcommand's body lives in its own module."""

from __future__ import annotations

from typing import Any

import click

from apportion.cli.alloc import alloc
from apportion.cli.credentials import token
from apportion.cli.inspect import dump, info, why
from apportion.cli.runs import RUN_COMMANDS
from apportion.cli.scheduler import scheduler
from apportion.cli.slurm import slurm
from apportion.cli.ssh import ssh
from apportion.cli.status import status
from apportion.cli.submit import submit
from apportion.cli.user import user
from apportion.cli.worker import worker
from apportion.home import PrivateFileError


class _Commands(click.Group):
    """The subcommands, with an unsafe home or private file said in one line by all."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PrivateFileError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Commands)
@click.version_option(package_name="apportion")
def main() -> None:
    """apportion: run tasks where the resources they need are free."""


main.add_command(scheduler)
main.add_command(worker)
main.add_command(info)
main.add_command(why)
main.add_command(dump)
main.add_command(status)
main.add_command(submit)
main.add_command(token)
main.add_command(user)
main.add_command(ssh)
main.add_command(alloc)
main.add_command(slurm)
for command in RUN_COMMANDS:
    main.add_command(command)


if __name__ == "__main__":
    main()
