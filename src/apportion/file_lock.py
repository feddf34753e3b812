"""Taking an ``flock`` that another process may hold for a moment.

The run journal and a scheduler file each have a lock file that its owner holds
for its whole life; a reader probes it (takes it shared and gives it back at once)
to tell a live owner from a dead one, so a claim may find it held for microseconds
and must retry briefly rather than take "held" for an answer.
"""

from __future__ import annotations

import fcntl
import time


def try_flock(fd: int, kind: int, *, patience: float) -> bool:
    """Take an flock of ``kind`` on ``fd`` without blocking, retrying for ``patience``
    seconds: a reader that probes a lock holds it for microseconds only."""
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
