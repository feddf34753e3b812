"""The process groups that must die with this worker, listed where its supervisor looks.

Work a worker starts in process groups of its own (command runs) would outlive a
worker killed with SIGKILL (by its supervisor for its memory, by the kernel, by
hand) and keep holding what the scheduler hands to the next attempt: a GPU, say.
So while a supervised worker runs, the groups alive are kept listed in a file
named by the worker's pid; the supervisor reads it when that pid dies without
having stopped them, and kills them. The list is only a clean-up aid: failing to
write it never fails the work.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Collection
from pathlib import Path

logger = logging.getLogger("apportion.worker")


def process_groups_path(worker_pid: int) -> Path:
    """Where the worker with this pid lists the process groups that must die with it."""
    return Path(tempfile.gettempdir()) / "apportion-run-groups" / str(worker_pid)


class ProcessGroups:
    """This worker's list of live process groups; a no-op without a ``path`` (the
    worker is not supervised: nobody would read it)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path

    def replace(self, groups: Collection[int]) -> None:
        """List exactly these groups (none: the file is removed)."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if groups:
                self.path.write_text(" ".join(str(pgid) for pgid in groups))
            else:
                self.path.unlink(missing_ok=True)
        except OSError as exc:  # only a crash clean-up aid: never fail the work for it
            logger.warning("cannot write %s: %s", self.path, exc)


def kill_orphaned_groups(worker_pid: int) -> int:
    """SIGKILL the process groups a dead worker left listed; how many were still there."""
    path = process_groups_path(worker_pid)
    try:
        groups = [int(word) for word in path.read_text().split()]
    except (OSError, ValueError):
        return 0
    path.unlink(missing_ok=True)
    killed = 0
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed
