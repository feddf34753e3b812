"""This process's CPU use between two heartbeats, as each heartbeat reports it."""

from __future__ import annotations

import psutil


class CpuUse:
    """Percent of one core this process used since the last look (every worker of a
    process reports the whole process's)."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        # Sampled once here, so that the first look covers the time since then.
        self._process.cpu_percent(interval=None)

    def since_last(self) -> float:
        """Since the last call (or since made); 0 when the system will not say."""
        try:
            return float(self._process.cpu_percent(interval=None))
        except psutil.Error:
            return 0.0
