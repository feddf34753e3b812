"""A warning for large values pickled into a task instead of scattered.

Nothing limits a value's size: any value this machine can hold travels. But a large
array passed as an argument is pickled into every task that takes it, carried
through the scheduler and kept there until the task ends; scattered once, it is
stored on a worker and tasks refer to it. Dask's users know the same warning.
"""

from __future__ import annotations

import warnings

#: Arguments pickling to more than this (bytes) are worth scattering (Dask's figure).
LARGE_ARGUMENT = 10 * 2**20


def warn_if_large(size: int, what: str, stacklevel: int = 4) -> None:
    """Warn, naming ``what`` and its ``size`` pickled, when that is large."""
    if size > LARGE_ARGUMENT:
        warnings.warn(
            f"{what} pickle to {size / 2**20:,.1f} MiB, carried in the task through the "
            "scheduler; consider scattering large values first "
            "(future = client.scatter(value)) and passing the future instead",
            UserWarning,
            stacklevel=stacklevel,
        )
