"""Tasks whose work outlives scheduler sessions: what a worker needs of their executor.

Most of a worker's tasks belong to one session with the scheduler and are dropped
with it. Some work must go on whatever happens to the scheduler (the job queue's
command runs): it is started by an ordinary task, but runs in an executor that
belongs to the worker process. When the scheduler restarts, the worker registers
again with the keys of that work still alive (``RegisterWorker.live_tasks``), and
the new scheduler may send the same tasks again, which then attach to it.

The worker knows such an executor only through ``LongLivedTasks``: it reports the
keys still alive, cancels keys the scheduler frees, and stops everything (with a
grace) when the worker closes, since nobody would report work that outlived its
worker. Whoever builds the worker chooses the executor (``Worker(long_lived=...)``);
a worker built without one runs no such work.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from apportion.protocol.base import Message

#: How long stopped work's processes get between SIGTERM and SIGKILL, unless told.
DEFAULT_KILL_GRACE = 10.0


@dataclass(frozen=True, slots=True)
class WorkerLink:
    """What a worker gives its long-lived executor when it takes it on."""

    #: Sends to the scheduler from any thread; kept while no scheduler is connected,
    #: and sent on the next registration.
    send: Callable[[Message], None]
    #: Seconds stopped work gets between SIGTERM and SIGKILL.
    kill_grace: float


class LongLivedTasks(Protocol):
    """An executor of tasks whose work outlives scheduler sessions (see the module)."""

    def attach(self, link: WorkerLink) -> None:
        """Serve the worker behind ``link``: called once, before any task runs."""
        ...

    def keys(self) -> list[str]:
        """Task keys a restarted scheduler may adopt: alive, or ended and not yet reported."""
        ...

    def cancel_keys(self, keys: Collection[str]) -> None:
        """Stop the work of these task keys, if any is this executor's."""
        ...

    def stop_all(self, timeout: float) -> int:
        """Stop all the work (the worker is closing), waiting up to ``timeout`` seconds;
        how many are still not gone."""
        ...
