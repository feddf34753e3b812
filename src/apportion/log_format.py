"""Log records as JSON lines, for ``--log-format json``.

One object per record, on one line, with ``time`` (ISO 8601, UTC, milliseconds),
``level``, ``logger``, ``message``, ``role`` (which apportion command wrote it),
``pid``, ``exception`` when the record carries a traceback, and the structured
fields a caller passed with ``extra=``. A log line must never take down the
process that writes it: a field that JSON cannot hold is written as its ``repr``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

#: The attributes every ``LogRecord`` has (and the two ``Formatter.format`` adds):
#: whatever else a record carries came from ``extra=``.
STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))
) | {"message", "asctime", "taskName"}

#: The fields this formatter writes itself; an ``extra=`` field of the same name
#: cannot replace them (it would make the line lie about where it came from).
OWN_FIELDS = frozenset({"time", "level", "logger", "message", "role", "pid", "exception", "stack"})


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON; ``role`` names the writing command."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON object (non-ASCII kept as is, no newline inside)."""
        fields: dict[str, Any] = {
            "time": _utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": _message(record),
            "role": self.role,
            "pid": record.process,
        }
        if record.exc_info and not record.exc_text:
            # Cached as Formatter.format does, so another handler need not redo it.
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            fields["exception"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        for name, value in vars(record).items():
            if name not in STANDARD_ATTRIBUTES and name not in OWN_FIELDS:
                fields[name] = _jsonable(value)
        return json.dumps(fields, ensure_ascii=False)


def _utc_time(created: float) -> str:
    moment = datetime.fromtimestamp(created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _jsonable(value: object) -> object:
    """``value`` if JSON can hold it, else its ``repr`` (checked one field at a time, so
    that one odd field does not turn the others into text too)."""
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):  # a set, an object, a cycle, NaN
        return _repr(value)
    return value


def _repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:  # a broken __repr__ must not lose the record
        return f"<{type(value).__name__} without a working repr>"


def _message(record: logging.LogRecord) -> str:
    # A bad format string or arguments must not lose the record: keep what was meant.
    try:
        return record.getMessage()
    except Exception as exc:  # any error of a caller's __str__ or format string
        return f"{_repr(record.msg)} % {_repr(record.args)} (unformattable: {_repr(exc)})"
