"""What ``progress`` draws: done and failed counts per task group, kept as futures finish.

Apart from ``progress.py`` so that its two ways of drawing, text there and the
Jupyter widget (``progress_widget.py``, imported only where ipywidgets is), read one
class without importing each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from functools import partial

from apportion.client.future import Future
from apportion.client.state import FINISHED
from apportion.core.groups import group_of


class Tally:
    """Done and failed counts per group, kept by done-callbacks from any thread."""

    def __init__(
        self, futures: Iterable[Future], multi: bool, group: Callable[[str], str] = group_of
    ) -> None:
        self._lock = threading.Lock()
        self.start = time.monotonic()
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self._all_done = threading.Event()
        self._left = 0
        self._futures = list(futures)
        names = [str(group(fut.key)) if multi else "all" for fut in self._futures]
        for name in names:
            self.total[name] = self.total.get(name, 0) + 1
            self.done.setdefault(name, 0)
            self.failed.setdefault(name, 0)
        self._left = len(self._futures)
        if not self._left:
            self._all_done.set()
        for fut, name in zip(self._futures, names, strict=True):
            fut.add_done_callback(partial(self._finished, group=name))

    def _finished(self, future: Future, group: str) -> None:
        with self._lock:
            if future.status == FINISHED:
                self.done[group] += 1
            else:  # raised, cancelled, or lost with its scheduler: no result either way
                self.failed[group] += 1
            self._left -= 1
            if self._left <= 0:
                self._all_done.set()

    def wait(self, timeout: float) -> bool:
        return self._all_done.wait(timeout)

    @property
    def finished(self) -> bool:
        return self._all_done.is_set()

    def rows(self) -> list[tuple[str, int, int, int]]:
        """``(group, done, failed, total)`` per group, in first-seen order."""
        with self._lock:
            return [(g, self.done[g], self.failed[g], t) for g, t in self.total.items()]
