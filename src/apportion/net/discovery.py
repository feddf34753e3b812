"""Which scheduler is the user's own: chosen from what the user's scheduler files say.

A command given no address talks to the scheduler that ``$APPORTION_HOME/scheduler.json``
names, never to a fixed port: on a shared machine ``127.0.0.1:8786`` may well be
another user's scheduler. Pure: the files are read, and their locks asked, by
``scheduler_claim.look``; this module decides from what was found, and says in one
line why nothing was when nothing was.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from apportion.net.address import parse_address

if TYPE_CHECKING:
    from apportion.net.scheduler_file import SchedulerFile

#: What to do when no scheduler of the user's runs, said at the end of that error.
HOW_TO_START = (
    "start one with `apportion scheduler`, or give a scheduler's address or --scheduler-file"
)


class Liveness(enum.Enum):
    """What a scheduler file's lock says of the scheduler that wrote the file."""

    LIVE = "live"
    STALE = "stale"
    #: No lock to ask (a file written by something that takes none, a file system
    #: that refuses locks): the file is taken at its word.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Sighting:
    """One scheduler file as a reader finds it: what it says, and whether its owner lives."""

    path: Path
    #: What the file says; None when it is missing or cannot be used (``problem``).
    found: SchedulerFile | None
    liveness: Liveness
    #: Why the file cannot be used (open to others, not JSON), in one line; None if it can.
    problem: str | None = None

    @property
    def usable(self) -> bool:
        """The file names a scheduler that runs, as far as can be told without connecting."""
        return self.found is not None and self.liveness is not Liveness.STALE


class NoScheduler(Exception):
    """No scheduler of the user's runs where a command looked; the message is one line."""


def choose_own(default: Sighting, others: Sequence[Sighting] = ()) -> SchedulerFile:
    """The scheduler the default file names, if it runs; else ``NoScheduler`` saying
    why, and naming the user's other running scheduler (``others``), if any."""
    if default.usable:
        assert default.found is not None
        return default.found
    if default.problem is not None:
        raise NoScheduler(default.problem)
    running = [s for s in others if s.usable and s.path != default.path]
    if default.found is None:
        why = f"no scheduler file at {default.path}"
    else:
        why = f"{default.path} is left by one that stopped ({default.found.address})"
    if running and running[0].found is not None:
        other = running[0]
        assert other.found is not None
        raise NoScheduler(
            f"no scheduler of yours is running with the default scheduler file ({why}); "
            f"yours at {other.found.address} is reached with --scheduler-file {other.path}"
        )
    raise NoScheduler(f"no scheduler of yours is running ({why}): {HOW_TO_START}")


def running_elsewhere(sightings: Sequence[Sighting]) -> str | None:
    """``"your scheduler at ADDRESS is running (scheduler file PATH)"`` for the first
    live one of ``sightings``; None if none is."""
    for sighting in sightings:
        if sighting.usable and sighting.found is not None:
            address, path = sighting.found.address, sighting.path
            return f"your scheduler at {address} is running (scheduler file {path})"
    return None


#: Host names that all mean this machine's loopback interface.
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def dashboard_owner(address: str, sightings: Sequence[Sighting]) -> SchedulerFile | None:
    """The scheduler whose dashboard is served at ``address``, by the dashboard URL its
    file gives; None if no file of the user's names it."""
    try:
        host, port = parse_address(address)
    except ValueError:
        return None
    for sighting in sightings:
        found = sighting.found
        if found is None or found.dashboard is None or not sighting.usable:
            continue
        try:
            url = urlsplit(found.dashboard)
            url_port = url.port
        except ValueError:
            continue
        if url_port == port and _same_host(url.hostname or "", host):
            return found
    return None


def _same_host(a: str, b: str) -> bool:
    return a == b or (a in _LOOPBACK and b in _LOOPBACK)
