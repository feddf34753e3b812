"""What ``concurrent.futures.wait`` and ``as_completed`` read of a future, for ours.

The standard functions do not call a future's methods to wait: they take its
``_condition``, read its ``_state`` and append a waiter to its ``_waiters``, which
the future must tell when it settles (the standard executors' futures do it in
``set_result``). Dask's futures have none of these, so those functions fail on them
(dask/distributed#3695). An apportion ``Future`` subclasses the standard one and
makes these parts on first use only: most futures are never passed to the standard
functions, and a lock and a list per future would cost every ``submit``.

Once made, they follow the key: this registers a callback on the key's state that,
when it settles, marks the future done and tells each waiter under the condition,
as ``set_result`` does. The standard future's states are final; so is this one's:
a key run again (``retry``) after it settled is not waited for a second time here.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures._base import CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any, Protocol

from apportion.client.state import CANCELLED
from apportion.client.state import FINISHED as KEY_FINISHED


class _KeyWaiting(Protocol):
    def add_callback(self, callback: Callable[[], None]) -> bool: ...


class Future(Protocol):
    """What this needs of a ``Future`` (future.py imports this module)."""

    _waiting: StandardWaiting | None

    @property
    def status(self) -> str: ...

    @property
    def _key_state(self) -> _KeyWaiting: ...


#: Taken only to make a future's parts, once per future that needs them.
_MAKING = threading.Lock()


class StandardWaiting:
    """One future's condition, state and waiters, as ``concurrent.futures`` reads them.

    It refers to its future weakly: the key's callback holds this, and a strong
    reference would keep a dropped future (and its result on the cluster) alive
    until the key settled.
    """

    __slots__ = ("condition", "future", "state", "waiters")

    def __init__(self, future: Future) -> None:
        self.condition = threading.Condition()
        #: The standard future's state: PENDING, then FINISHED or CANCELLED_AND_NOTIFIED.
        self.state = PENDING
        #: ``concurrent.futures`` waiters (``_Waiter``), told when the key settles.
        self.waiters: list[Any] = []
        self.future = weakref.ref(future)

    def settled(self) -> None:
        """The key settled: mark the future done and tell its waiters (the client's
        loop thread runs this; it only takes the condition, briefly)."""
        future = self.future()
        if future is None:
            return
        status = future.status
        with self.condition:
            if self.state != PENDING:
                return
            if status == CANCELLED:
                self.state = CANCELLED_AND_NOTIFIED
                for waiter in self.waiters:
                    waiter.add_cancelled(future)
            else:
                self.state = FINISHED
                for waiter in self.waiters:
                    if status == KEY_FINISHED:
                        waiter.add_result(future)
                    else:  # failed or lost: ``wait(FIRST_EXCEPTION)`` returns on it
                        waiter.add_exception(future)
            self.condition.notify_all()


def standard_waiting(future: Future, made: StandardWaiting | None) -> StandardWaiting:
    """``future``'s parts (``made``), or new ones following its key."""
    if made is not None:
        return made
    with _MAKING:
        made = future._waiting
        if made is not None:
            return made
        made = StandardWaiting(future)
        future._waiting = made
    if not future._key_state.add_callback(made.settled):
        made.settled()  # settled already: done now
    return made
