"""Durations as Dask's users write them: ``30``, ``"30s"``, ``"100 ms"``, ``"2 minutes"``.

Dask accepts such strings wherever it takes a timeout (``Client(timeout="60s")``,
``future.result(timeout="10s")``); a script moved to apportion must not fail on one.
"""

from __future__ import annotations

import datetime
import math
import re

_UNITS = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
#: What a timeout may be given as.
Duration = float | str | datetime.timedelta

_TEXT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*")


def seconds(value: float | str | datetime.timedelta | None, what: str = "timeout") -> float | None:
    """``value`` in seconds; None stays None (no limit). Raises ``ValueError`` naming
    ``what`` for text that is not a duration, or a negative one."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    elif isinstance(value, str) and (found := _TEXT.fullmatch(value)):
        number, unit = found.groups()
        scale = _UNITS.get(unit.lower() or "s")
        if scale is None:
            raise ValueError(f"{what}={value!r}: unknown unit {unit!r} (use ms, s, m, h or d)")
        result = float(number) * scale
    else:
        raise ValueError(f"{what}={value!r} is not a duration: give seconds or text like '30s'")
    if math.isnan(result) or result < 0:
        raise ValueError(f"{what}={value!r}: a duration cannot be negative")
    return result
