"""``JsonFormatter``: one JSON object per record, whatever the record carries."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

from apportion.log_format import JsonFormatter


def _record(msg: str = "hello %s", *args: object, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("apportion.test", logging.WARNING, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def _format(record: logging.LogRecord, role: str = "scheduler") -> dict[str, Any]:
    line = JsonFormatter(role).format(record)
    assert "\n" not in line
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def test_a_record_has_the_documented_fields() -> None:
    record = _record("hello %s", "world")
    record.created = 1795514400.1239  # 2026-11-24T10:00:00.123Z
    fields = _format(record, role="worker")
    assert fields == {
        "time": "2026-11-24T10:00:00.123Z",
        "level": "WARNING",
        "logger": "apportion.test",
        "message": "hello world",
        "role": "worker",
        "pid": record.process,
    }


def test_the_time_is_utc_with_milliseconds() -> None:
    fields = _format(_record())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["time"])


def test_a_record_with_exc_info_carries_the_traceback_text() -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        record = _record("failed")
        record.exc_info = sys.exc_info()
    fields = _format(record)
    assert fields["message"] == "failed"
    assert fields["exception"].startswith("Traceback (most recent call last):")
    assert fields["exception"].endswith("ValueError: bad value")


def test_extra_fields_are_kept_and_standard_attributes_are_not() -> None:
    logger = logging.getLogger("apportion.test.extra")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        logger.warning("run %s", "r1", extra={"run_id": "r1", "attempt": 2, "tags": ["a"]})
    finally:
        logger.removeHandler(handler)
    fields = _format(records[0])
    assert fields["run_id"] == "r1" and fields["attempt"] == 2 and fields["tags"] == ["a"]
    for standard in ("args", "msg", "levelno", "lineno", "thread", "exc_text", "created"):
        assert standard not in fields


def test_an_extra_field_cannot_replace_an_own_field() -> None:
    fields = _format(_record(role="impostor", pid="x"), role="alloc")
    assert fields["role"] == "alloc" and isinstance(fields["pid"], int)


def test_a_field_json_cannot_hold_is_written_as_its_repr() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    cycle: list[object] = []
    cycle.append(cycle)
    odd = {"thing": Opaque(), "pool": {1, 2}, "keys": {(1, 2): "x"}, "cycle": cycle}
    fields = _format(_record(**odd, nan=float("nan"), b=Broken()))
    assert fields["thing"] == "<opaque>"
    assert fields["pool"] == "{1, 2}"
    assert fields["keys"] == "{(1, 2): 'x'}"
    assert fields["cycle"] == "[[...]]"
    assert fields["nan"] == "nan"
    assert fields["b"] == "<Broken without a working repr>"


def test_a_message_that_cannot_be_formatted_is_kept_as_given() -> None:
    fields = _format(_record("%d items", "many"))
    assert fields["message"].startswith("'%d items' % ('many',)")


def test_unicode_is_written_as_is() -> None:
    line = JsonFormatter("worker").format(_record("gpu %s: 温度 ✓", "ü", note="naïve"))
    assert "温度 ✓" in line and "naïve" in line
    fields = json.loads(line)
    assert fields["message"] == "gpu ü: 温度 ✓" and fields["note"] == "naïve"
