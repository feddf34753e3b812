"""What goes to the scheduler from outside the worker's loop, or while it is away.

Task threads (a run's output and end, ``TaskNote``) hand their messages over in
batches: the first of a batch wakes the loop once, which sends them all in order.
While no scheduler is connected they are kept, up to ``MAX_UNSENT_BYTES``, and go
out first on the next registration: a run's output and end must not be lost.
Output beyond the bound is dropped (the run's log shows the gap), and so is what
tasks print for clients (``Publish``: clients that were away missed it anyway);
nothing else is.
"""

from __future__ import annotations

import threading

from apportion.core.payload import size_of
from apportion.net.connection import Connection
from apportion.protocol.base import Message
from apportion.protocol.coordination import Publish
from apportion.protocol.services import TaskNote

#: Run output kept while the scheduler is away, at most (beyond it, output is dropped).
MAX_UNSENT_BYTES = 64 * 2**20


class Outbox:
    """Messages from task threads not taken by the loop yet, and those kept unsent."""

    def __init__(self) -> None:
        #: Messages task threads sent and the loop has not taken yet.
        self._from_threads: list[Message] = []
        self._lock = threading.Lock()
        #: Messages kept while no scheduler is connected, in order; their bytes.
        self._unsent: list[Message] = []
        self._unsent_bytes = 0

    def from_thread(self, message: Message) -> bool:
        """Keep ``message`` from a task thread; True if the loop must be woken for it."""
        with self._lock:
            self._from_threads.append(message)
            return len(self._from_threads) == 1

    def threads_waiting(self) -> bool:
        """Task threads said something not sent yet (read without the lock: what must
        precede a task's outcome was appended before the outcome was)."""
        return bool(self._from_threads)

    def take_from_threads(self) -> list[Message]:
        with self._lock:
            batch, self._from_threads = self._from_threads, []
        return batch

    def send_or_keep(self, scheduler: Connection | None, message: Message) -> None:
        """Send now, or keep for the next session (droppable output past the bound)."""
        if scheduler is not None:
            scheduler.send(message)
            return
        if isinstance(message, TaskNote):
            droppable, size = bool(message.droppable), len(message.note)
        elif isinstance(message, Publish):
            droppable, size = True, size_of(message.data)
        else:
            droppable, size = False, 64
        if self._unsent_bytes + size > MAX_UNSENT_BYTES and droppable:
            return
        self._unsent.append(message)
        self._unsent_bytes += size

    def take_unsent(self) -> list[Message]:
        """What waited for a session, in order; kept no more."""
        unsent, self._unsent, self._unsent_bytes = self._unsent, [], 0
        return unsent
