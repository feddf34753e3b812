"""Recent log records kept in memory, for ``get_worker_logs`` and ``get_scheduler_logs``.

A ``logging.Handler`` on the root logger (records of ``apportion``'s loggers reach it
by propagation) that keeps the last records in a bounded ring: a long-lived worker
costs a fixed amount of memory however much it logs.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable

#: Records kept per ring, as Dask keeps (``distributed.admin.log-length``).
LOG_LENGTH = 10_000

#: How each record is written, as Dask's default ``distributed.admin.log-format``.
LOG_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"


class LogRing(logging.Handler):
    """The last ``size`` records of level INFO and above, as ``(level, text)``.

    ``only`` keeps the records of these logger names (and their children); ``skip``
    drops those of these. Both matter where several roles share one process (an
    in-process LocalCluster): the scheduler's ring keeps the scheduler's records.
    """

    def __init__(
        self,
        size: int = LOG_LENGTH,
        *,
        only: Iterable[str] = (),
        skip: Iterable[str] = (),
    ) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self._records: deque[tuple[str, str]] = deque(maxlen=size)
        self._ring_lock = threading.Lock()
        self._only = tuple(only)
        self._skip = tuple(skip)

    def _wanted(self, name: str) -> bool:
        def under(prefixes: tuple[str, ...]) -> bool:
            return any(name == p or name.startswith(p + ".") for p in prefixes)

        return (not self._only or under(self._only)) and not under(self._skip)

    def emit(self, record: logging.LogRecord) -> None:
        if not self._wanted(record.name):
            return
        try:
            text = self.format(record)
        except Exception:  # a bad format string in someone's log call must not spread
            text = f"{record.name} {record.levelname} {record.msg!r}"
        with self._ring_lock:
            self._records.append((record.levelname, text))

    def recent(self, n: int | None = None) -> list[tuple[str, str]]:
        """The last ``n`` records (all kept when ``n`` is None or not positive), oldest first."""
        with self._ring_lock:
            records = list(self._records)
        return records[-n:] if n is not None and n > 0 else records

    def attach(self) -> None:
        """Start collecting (a root logger handler)."""
        # Levels are left as they are: the ring sees what the process's logging
        # configuration lets through (a LocalCluster's worker processes: WARNING up).
        logging.getLogger().addHandler(self)

    def detach(self) -> None:
        """Stop collecting; the records kept so far stay readable."""
        logging.getLogger().removeHandler(self)
