"""Helpers the benchmark scripts share (not tasks: those live in tasks.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``done`` until true; raise ``TimeoutError`` saying ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout}s")
        time.sleep(0.02)


def dask_task_count(dask_scheduler: Any) -> int:
    """Run on Dask's scheduler (``client.run_on_scheduler``): tasks it still holds."""
    return len(dask_scheduler.tasks)
