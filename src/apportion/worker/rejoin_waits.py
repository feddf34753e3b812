"""Task threads blocked in ``rejoin``, until their task may run on.

A seceded task that gave its resources back waits in ``rejoin`` for the scheduler
to give them back (the state machine's ``ResumeTask``). The thread blocks on an
event here; the loop sets it. When the task can never go on — the worker lost its
scheduler, which has dropped the task, or is closing — the wait ends with
``CancelledError`` instead of blocking the thread for ever.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError


class _Wait:
    __slots__ = ("done", "failure")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.failure: str | None = None


class RejoinWaits:
    """Keys whose threads wait in ``rejoin``; thread-safe."""

    def __init__(self) -> None:
        self._waits: dict[str, _Wait] = {}
        self._lock = threading.Lock()

    def add(self, key: str) -> _Wait:
        """From the task's thread, before it asks to rejoin."""
        wait = _Wait()
        with self._lock:
            self._waits[key] = wait
        return wait

    def wait(self, key: str, wait: _Wait) -> None:
        """Block until ``resume`` or ``fail`` of ``key``; ``CancelledError`` on failure."""
        wait.done.wait()
        if wait.failure is not None:
            raise CancelledError(f"task {key!r} cannot rejoin: {wait.failure}")

    def resume(self, key: str) -> None:
        """The task may run on (from the loop)."""
        with self._lock:
            wait = self._waits.pop(key, None)
        if wait is not None:
            wait.done.set()

    def fail(self, key: str, why: str) -> None:
        with self._lock:
            wait = self._waits.pop(key, None)
        if wait is not None:
            wait.failure = why
            wait.done.set()

    def fail_all(self, why: str) -> None:
        with self._lock:
            waits, self._waits = self._waits, {}
        for wait in waits.values():
            wait.failure = why
            wait.done.set()
