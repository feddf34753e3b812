"""How sizes of memory and data are written for people, in logs and errors.

Pure, so that the scheduler's and the worker's state machines quote sizes the same
way as the services do.
"""

from __future__ import annotations


def format_bytes(n: float, digits: int = 1) -> str:
    """``1536 * 2**20`` -> ``"1.5 GiB"``: how memory is quoted in logs and errors;
    ``digits=2`` gives Dask's ``"1.50 GiB"`` (the notebook card, which Dask's users
    read side by side with Dask's)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.{digits}f} {unit}"
        value /= 1024
    return f"{value:.{digits}f} TiB"
