"""Services that run beside a scheduler, as its clients: the ``Companion`` protocol.

Some services belong with one scheduler without being part of it: the job queue
serves a journal of command runs for as long as its scheduler runs. The scheduler
knows them only through ``Companion``: it starts each once it listens and before
it admits any worker, so that a worker's still-running tasks are offered to a
service that is ready for them; and it closes them first when it closes, before
its workers' connections drop, so that their leaving does not reach a service
that would act on it. A companion talks to the scheduler as any client does, at
the address it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SchedulerAddresses:
    """Where a companion finds its scheduler."""

    #: Where workers and clients reach the scheduler: what to tell others.
    public: str
    #: Where a companion in the scheduler's process connects: in memory (``inproc://``)
    #: whatever the public address, so its traffic never touches a socket.
    local: str


class Companion(Protocol):
    """A service started and closed with its scheduler (see the module)."""

    #: Names of the loggers whose records belong in the scheduler's log ring
    #: (``Client.get_scheduler_logs``).
    loggers: tuple[str, ...]

    async def start(self, scheduler: SchedulerAddresses) -> None:
        """Connect and get ready; called on the scheduler's loop, once it listens.

        Raising fails the scheduler's start, which then closes what it opened."""
        ...

    async def close(self) -> None:
        """Disconnect and stop; called on the scheduler's loop, first when it closes."""
        ...
