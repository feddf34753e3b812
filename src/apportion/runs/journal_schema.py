"""The journal's tables, and how one of their rows becomes a ``RunRecord``.

The SQL the journal runs (``journal.py``) names its columns in the order of
``COLUMNS``, which ``record_from_row`` reads back. ``SCHEMA_VERSION`` is written
into each journal: one written by a newer apportion is refused, never misread; one
of an older version is brought up to date when opened (``MIGRATIONS``), since every
change so far only added a column with a default.
"""

from __future__ import annotations

import json
from typing import Any

from apportion.runs.run_record import RunRecord
from apportion.runs.run_states import FINISHED
from apportion.runs.spec import RunSpec, stored_demand

#: Version of the tables below; a journal written by a newer apportion is refused.
SCHEMA_VERSION = 2

#: Version -> the statements that bring a journal of that version to the next one.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: how many attempts were preempted (not failures: they use no retry).
    1: ("ALTER TABLE runs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0",),
}

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS environments (
        id INTEGER PRIMARY KEY,
        digest TEXT NOT NULL UNIQUE,
        env TEXT NOT NULL)""",
    # AUTOINCREMENT: ids are never reused, even after rm or prune, so an id a user
    # noted down never comes to mean another run.
    """CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,
        env_id INTEGER NOT NULL REFERENCES environments(id),
        priority INTEGER NOT NULL,
        created REAL NOT NULL,
        started REAL,
        ended REAL,
        worker TEXT NOT NULL DEFAULT '',
        held TEXT NOT NULL DEFAULT '',
        attempts INTEGER NOT NULL DEFAULT 0,
        exit_code INTEGER,
        signal INTEGER,
        reason TEXT NOT NULL DEFAULT '',
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        array_id INTEGER,
        array_index INTEGER,
        waiting TEXT NOT NULL DEFAULT '',
        preemptions INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS runs_by_state ON runs(state)",
    "CREATE INDEX IF NOT EXISTS runs_by_env ON runs(env_id)",
    "CREATE INDEX IF NOT EXISTS runs_cancelling ON runs(id) WHERE cancel_requested = 1",
    """CREATE TABLE IF NOT EXISTS history (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL,
        time REAL NOT NULL,
        text TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS history_by_run ON history(run_id)",
)

COLUMNS = (
    "id, name, state, spec, env_id, priority, created, started, ended, worker, held,"
    " attempts, exit_code, signal, reason, cancel_requested, array_id, array_index, waiting,"
    " preemptions"
)

#: Binds a list of ids or states as one parameter: no limit on how many.
IN_LIST = "(SELECT value FROM json_each(?))"

FINISHED_LIST = json.dumps(sorted(FINISHED))


def record_from_row(row: tuple[Any, ...], env: dict[str, str]) -> RunRecord:
    """A record from a row of ``COLUMNS``; the spec is trusted (we wrote it)."""
    fields = json.loads(row[3])
    fields["command"] = tuple(fields["command"])
    # Parsed from the text (once per distinct text); older versions also stored the
    # resources in numbers under this name, which this replaces.
    fields["demand"] = stored_demand(fields["resources"])
    return RunRecord(
        id=row[0],
        name=row[1],
        state=row[2],
        spec=RunSpec(env=env, **fields),
        priority=row[5],
        created=row[6],
        started=row[7],
        ended=row[8],
        worker=row[9],
        held=row[10],
        attempts=row[11],
        exit_code=row[12],
        signal=row[13],
        reason=row[14],
        cancel_requested=bool(row[15]),
        array_id=row[16],
        array_index=row[17],
        waiting=row[18],
        preemptions=row[19],
    )
