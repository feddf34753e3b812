"""Task functions shared by the benchmarks.

A real module, not ``__main__``: both systems pickle these by reference, so each
worker process imports this file. ``throughput.py`` puts this directory on
``PYTHONPATH`` before starting any worker, which is what makes that import work in
apportion's fresh worker interpreters and in Dask's spawned worker processes alike.
"""

from __future__ import annotations

from collections.abc import Iterable


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
