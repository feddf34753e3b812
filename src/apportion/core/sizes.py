"""How sizes of memory and data are written for people, in logs and errors.

Pure, so that the scheduler's and the worker's state machines quote sizes the same
way as the services do.
"""

from __future__ import annotations


def format_bytes(n: int) -> str:
    """``1536 * 2**20`` -> ``"1.5 GiB"``: how memory is quoted in logs and errors."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
