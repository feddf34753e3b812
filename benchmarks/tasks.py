"""Task functions shared by the benchmarks.

A real module, not ``__main__``: both systems pickle these by reference, so each
worker process imports this file. ``share_with_workers()`` puts this directory on
``PYTHONPATH`` before any worker starts, which is what makes that import work in
apportion's fresh worker interpreters and in Dask's spawned worker processes alike.
(The benchmark scripts import this module directly: Python puts a script's own
directory first on ``sys.path``.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def share_with_workers() -> None:
    """Let worker processes started from now on import this module; quiet Dask's logs."""
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")


def noop(x: object) -> None:
    """Do nothing: the task's cost is all scheduling overhead."""


def inc(x: int) -> int:
    return x + 1


def add(x: int, y: int) -> int:
    return x + y


def sum_of(values: Iterable[int]) -> int:
    return sum(values)


def timed_sleep_apportion(seconds: float) -> tuple[float, float, str]:
    """Sleep on an apportion worker; return wall-clock start, end and the worker's name."""
    import time

    import apportion

    start = time.time()
    time.sleep(seconds)
    return start, time.time(), apportion.get_worker().name


def timed_sleep_dask(seconds: float) -> tuple[float, float, str]:
    """Sleep on a Dask worker; return wall-clock start, end and the worker's name."""
    import time

    import distributed

    start = time.time()
    time.sleep(seconds)
    return start, time.time(), str(distributed.get_worker().name)


#: How long each task of the recovery benchmark sleeps.
SLEEP_SECONDS = 0.005


def sleepy_inc(x: int) -> int:
    """``inc`` that takes 5 ms, like a small real task."""
    import time

    time.sleep(SLEEP_SECONDS)
    return x + 1


def sleepy_add(x: int, y: int) -> int:
    """``add`` that takes 5 ms, like a small real task."""
    import time

    time.sleep(SLEEP_SECONDS)
    return x + y


def is_even(x: int) -> bool:
    return x % 2 == 0


def filled(value: int, nbytes: int) -> Any:
    """A float64 NumPy array of ``nbytes`` bytes, every element ``value``: cheap to make."""
    import numpy as np

    return np.full(nbytes // 8, value, dtype=np.float64)


def array_sum(array: Any) -> float:
    """The sum of ``array``: it reads every byte, at little cost beside moving them."""
    return float(array.sum())
