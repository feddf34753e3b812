"""Helpers the benchmark scripts share (not tasks: those live in tasks.py)."""

from __future__ import annotations

import gc
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


def settle_apportion(client: Any) -> None:
    """Wait until apportion's scheduler holds no task (between timed runs)."""
    gc.collect()  # drop the previous run's futures, so their releases go now
    wait_until(
        lambda: sum(client.scheduler_info()["tasks"].values()) == 0,
        "apportion scheduler still holds tasks",
    )


def settle_dask(client: Any) -> None:
    """Wait until Dask's scheduler holds no task (between timed runs)."""
    gc.collect()
    wait_until(
        lambda: client.run_on_scheduler(dask_task_count) == 0,
        "dask scheduler still holds tasks",
    )
