"""A cheap estimate of how many bytes a result holds.

The scheduler uses it to prefer workers holding most of a task's input bytes. An
estimate is enough, and it must stay cheap: it runs once per task, so containers
are summed one level deep over at most ``SAMPLE`` items and extrapolated. It never
raises: an object whose ``nbytes`` or ``__sizeof__`` raises (a Dask collection's
``nbytes`` does) counts as what Python says of it, or 0, so that the task that made
it still finishes.
"""

from __future__ import annotations

import sys
from typing import Any

#: Items of a container looked at before extrapolating.
SAMPLE = 10


def sizeof(obj: Any) -> int:
    """Approximate size in bytes of ``obj``."""
    if isinstance(obj, bytes | bytearray):
        return len(obj)
    if isinstance(obj, memoryview):
        return obj.nbytes
    nbytes = _nbytes(obj)  # NumPy arrays, pandas objects, Arrow buffers
    if nbytes is not None:
        return nbytes
    if isinstance(obj, list | tuple | set | frozenset):
        return sys.getsizeof(obj) + _sampled(list(_head(obj)), len(obj))
    if isinstance(obj, dict):
        keys = list(_head(obj))
        return sys.getsizeof(obj) + _sampled(keys + [obj[k] for k in keys], 2 * len(obj))
    return _getsizeof(obj)


def _nbytes(obj: Any) -> int | None:
    """``obj.nbytes`` where it is an int (not a class's descriptor), else None."""
    if isinstance(obj, type):
        return None
    try:
        nbytes = getattr(obj, "nbytes", None)
    except Exception:  # a property that refuses (Dask's collections)
        return None
    return nbytes if isinstance(nbytes, int) else None


def _getsizeof(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:  # some extension objects refuse
        return 0


def _head(items: Any) -> Any:
    for index, item in enumerate(items):
        if index >= SAMPLE:
            return
        yield item


def _sampled(sample: list[Any], total: int) -> int:
    if not sample:
        return 0
    shallow = sum(_shallow(item) for item in sample)
    return shallow * total // len(sample)


def _shallow(obj: Any) -> int:
    if isinstance(obj, bytes | bytearray):
        return len(obj)
    nbytes = _nbytes(obj)
    return _getsizeof(obj) if nbytes is None else nbytes
