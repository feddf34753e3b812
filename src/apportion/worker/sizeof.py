"""A cheap estimate of how many bytes a result holds.

The scheduler uses it to prefer workers holding most of a task's input bytes. An
estimate is enough, and it must stay cheap: it runs once per task, so containers
are summed one level deep over at most ``SAMPLE`` items and extrapolated.
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
    nbytes = getattr(obj, "nbytes", None)  # NumPy arrays, pandas objects, Arrow buffers
    if isinstance(nbytes, int) and not isinstance(obj, type):
        return nbytes
    if isinstance(obj, list | tuple | set | frozenset):
        return sys.getsizeof(obj) + _sampled(list(_head(obj)), len(obj))
    if isinstance(obj, dict):
        keys = list(_head(obj))
        return sys.getsizeof(obj) + _sampled(keys + [obj[k] for k in keys], 2 * len(obj))
    try:
        return sys.getsizeof(obj)
    except TypeError:  # some extension objects refuse
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
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(obj, type):
        return nbytes
    try:
        return sys.getsizeof(obj)
    except TypeError:
        return 0
