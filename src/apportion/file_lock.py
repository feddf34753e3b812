"""A lock file held by its owner for life, saying who the owner is.

The run journal and a scheduler file each have a lock file that its owner holds
(an exclusive ``flock``) for its whole life, with its ``pid address`` line in it
for others' messages. A reader probes it (``held``: takes it shared and gives it
back at once) to tell a live owner from a dead one, so a claim may find it held
for microseconds and must retry briefly rather than take "held" for an answer.
"""

from __future__ import annotations

import fcntl
import os
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


def held(fd: int) -> bool:
    """Whether another process holds the lock open as ``fd`` now (its owner lives)."""
    if try_flock(fd, fcntl.LOCK_SH, patience=0.0):
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    return True


def write_owner(fd: int, address: str) -> None:
    """Say in the lock that this process owns it, listening at ``address``."""
    data = f"{os.getpid()} {address}\n".encode()
    # Readers take the first line, so junk after it from a longer old text is harmless.
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def read_owner(fd: int, *, patience: float = 0.0) -> tuple[int, str]:
    """The owner's ``(pid, address)`` as it wrote them in the lock, waiting up to
    ``patience`` seconds for an owner that has locked but not written yet; 0 and ""
    for what it has not written."""
    deadline = time.monotonic() + patience
    while True:
        first = os.pread(fd, 4096, 0).decode(errors="replace").split("\n", 1)[0]
        pid, _, address = first.partition(" ")
        address = address.strip()
        if (pid.isdigit() and address) or time.monotonic() >= deadline:
            return (int(pid) if pid.isdigit() else 0), address
        time.sleep(0.005)
