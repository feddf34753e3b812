"""What a running task may ask about where it runs: its resources and its worker.

Thread-local because each of a worker's threads runs one task at a time, and two
workers may share a process (tests, ``LocalCluster`` in threads).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from apportion.core.resources import to_units

if TYPE_CHECKING:
    from apportion.worker.service import Worker

_local = threading.local()


@contextmanager
def running_task(worker: Worker, resources: Mapping[str, int]) -> Iterator[None]:
    """Within this block, this thread runs a task on ``worker`` holding ``resources``."""
    previous = getattr(_local, "task", None)
    _local.task = (worker, to_units(resources))
    try:
        yield
    finally:
        _local.task = previous


def task_resources() -> dict[str, float]:
    """The resources the running task holds, in units: ``{"GPU": 1.0}``.

    Raises ``RuntimeError`` outside a task, rather than answer ``{}`` and let code
    believe it holds nothing when it is simply not running on a worker.
    """
    current = getattr(_local, "task", None)
    if current is None:
        raise RuntimeError("task_resources() is only available inside a task running on a worker")
    return dict(current[1])


def get_worker() -> Worker:
    """The ``Worker`` running the current task; ``RuntimeError`` outside a task."""
    current = getattr(_local, "task", None)
    if current is None:
        raise RuntimeError("get_worker() is only available inside a task running on a worker")
    worker: Worker = current[0]
    return worker
