"""The scheduler file of a command that starts a scheduler (``apportion scheduler``,
``apportion ssh``): claimed before anything starts, written once the address is known,
removed on the way out. The claim itself is ``net/scheduler_claim.py``'s.

Given ``--scheduler-file``, a file another running scheduler holds is refused, in one
line. Given none, the command takes ``$APPORTION_HOME/scheduler.json``, where the
user's other commands look, unless another running scheduler of the user's holds
it: it then writes ``scheduler-<port>.json`` beside it and says so, and the first
keeps its file.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from apportion.cli.log_options import announce
from apportion.net.address import parse_address
from apportion.net.scheduler_claim import SchedulerFileBusy, SchedulerFileClaim, take_spare
from apportion.net.scheduler_file import default_scheduler_file, remove_scheduler_file

logger = logging.getLogger("apportion.cli")


class OwnSchedulerFile:
    """The claim on one command's scheduler file (see the module docstring)."""

    def __init__(self, given: Path | None) -> None:
        path = given or default_scheduler_file()
        #: The claim held; None while the default file is another's and no spare is taken.
        self.claim: SchedulerFileClaim | None = None
        #: The default file's refusal, when another running scheduler holds it.
        self.busy: SchedulerFileBusy | None = None
        try:
            self.claim = SchedulerFileClaim.take(path)
        except SchedulerFileBusy as busy:
            if given is not None:
                raise click.ClickException(
                    f"{busy}: give another --scheduler-file, or leave it out to have a "
                    "file of this scheduler's own"
                ) from None
            self.busy = busy
        except OSError as exc:
            raise click.ClickException(f"cannot claim the scheduler file {path}: {exc}") from None

    def path_for(self, address: str) -> Path:
        """The file to write for the scheduler now listening at ``address``: the one
        claimed, or a spare named for its port; ``OSError`` if none can be claimed."""
        if self.claim is None:
            assert self.busy is not None
            self.claim = take_spare(self.busy.path, parse_address(address)[1])
        if not self.claim.locked:
            logger.warning(
                "cannot lock %s here (the file system refuses locks): another scheduler "
                "may take this file over",
                self.claim.path,
            )
        self.claim.note(address)
        return self.claim.path

    def announce_spare(self) -> None:
        """Say, if this command could not have the default file, whose it is and how
        to reach this one."""
        if self.busy is not None and self.claim is not None:
            announce(
                f"the default scheduler file {self.busy.path} belongs to "
                f"{self.busy.holder.text()}: reach this one with --scheduler-file "
                f"{self.claim.path}",
                logging.WARNING,
            )

    def release(self, scheduler_id: str | None = None) -> None:
        """Remove the file if it is still scheduler ``scheduler_id``'s, and let the claim
        go; idempotent."""
        claim, self.claim = self.claim, None
        if claim is None:
            return
        if scheduler_id is not None:
            remove_scheduler_file(claim.path, scheduler_id)
        claim.release()
