"""The journal: every run, its state and its story, in one SQLite file.

Theory of operation
-------------------
The scheduler writes each change of a run here before acting on it, so a scheduler
killed with SIGKILL loses nothing: the next one reads the journal and carries on.
SQLite in WAL mode with ``synchronous=NORMAL`` makes each commit survive the death of
the process (only a power cut may drop the last few), lets readers such as
``apportion runs`` read while the scheduler writes, and queues writers from several
processes behind a 10 s busy timeout instead of failing with "database is locked".

Every write takes the write lock up front (``BEGIN IMMEDIATE``): a transaction that
read first and then tried to write could find another process had written since,
and SQLite can only fail it. ``batch()`` groups many changes into one commit (the
scheduler commits once per turn of its loop); inside a batch each method still
changes all it was asked to or nothing, by a savepoint.

A run's state moves only along ``RUN_MOVES`` (``run_states``, shared with the
queue's lifecycle); anything else raises ``IllegalTransition``, because a run
completing twice or restarting after cancellation is a bug upstream. Environments
are stored once per distinct content: the elements of an array, or runs submitted
from one shell, share one, so a 10,000-element array does not hold 10,000 copies.

One scheduler serves a journal at a time: ``claim`` takes an ``flock`` on
``<journal>.lock``, which the kernel drops when the process dies however it dies,
so a stale lock file never blocks the next scheduler.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sqlite3
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from apportion.file_lock import held, read_owner, try_flock, write_owner
from apportion.home import default_home, home_dir, private_dir, user_dir
from apportion.runs.journal_schema import (
    COLUMNS,
    FINISHED_LIST,
    IN_LIST,
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
    record_from_row,
)
from apportion.runs.run_record import TIMED_OUT, RunRecord, describe_exit
from apportion.runs.run_states import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FINISHED,
    LOST,
    QUEUED,
    RUN_MOVES,
    RUNNING,
    STAGED,
    STATES,
    check_run_move,
)
from apportion.runs.spec import RunSpec

# The states are the lifecycle's (``run_states``); readers of the journal name them from here.
__all__ = [
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "FINISHED",
    "LOST",
    "QUEUED",
    "RUNNING",
    "RUN_MOVES",
    "SCHEMA_VERSION",
    "STAGED",
    "STATES",
    "TIMED_OUT",
    "Journal",
    "JournalBusy",
    "JournalError",
    "RunRecord",
    "default_home",
    "default_journal_path",
    "describe_exit",
]


def default_journal_path() -> Path:
    """The journal used when none is named: ``runs.db`` in ``default_home()``
    (``PrivateFileError`` if that home is not the user's own)."""
    return home_dir() / "runs.db"


class JournalError(Exception):
    """The journal cannot be used: not a journal, written by a newer apportion, or busy."""


class JournalBusy(JournalError):
    """Another live scheduler serves this journal; says which."""

    def __init__(self, path: Path, pid: int, address: str) -> None:
        #: Process id of the scheduler holding the journal (0 if it has not said yet).
        self.pid = pid
        #: Address that scheduler listens on ("" if it has not said yet).
        self.address = address
        super().__init__(
            f"journal {path} is served by the scheduler at {address or '?'} (pid {pid or '?'})"
        )


class Journal:
    """The runs of one journal file. Each process opens its own.

    May be handed from one thread to another, but not used by two at once.
    """

    def __init__(self, path: str | Path) -> None:
        #: The SQLite file.
        self.path = Path(path)
        #: Output of run N goes to ``N.log`` here; created on first output.
        self.logs_dir = self.path.with_name(self.path.stem + "-logs")
        self._lock_path = Path(f"{self.path}.lock")
        #: Open descriptor of the lock file while this object serves the journal.
        self._lock_fd: int | None = None
        self._address = ""
        #: 0 outside ``batch()``; else how many batches are open.
        self._depth = 0
        #: Whether the logs directory was found (or made) private to its user.
        self._logs_checked = False
        #: Log files of removed runs, deleted once the removal commits.
        self._unlink_on_commit: list[Path] = []
        user_dir(self.path.parent)
        # Run specs, commands and outputs are the user's business: the journal (and
        # the WAL files SQLite gives the same mode), its lock and logs are user-only.
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            # Autocommit (isolation_level=None): transactions are begun by batch() alone.
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
        except sqlite3.Error as error:
            raise JournalError(f"cannot open journal {self.path}: {error}") from None
        try:
            self._open()
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise JournalError(f"{self.path} is not a usable journal: {error}") from None
        except BaseException:
            self._db.close()
            raise

    def _open(self) -> None:
        self._db.execute("PRAGMA busy_timeout = 10000")
        mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise JournalError(
                f"{self.path}: SQLite cannot use WAL mode there (network file system?)"
            )
        self._db.execute("PRAGMA synchronous = NORMAL")
        version = self._version()
        if version is None:
            with self.batch():
                for statement in SCHEMA:
                    self._db.execute(statement)
                self._db.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            version = self._version()
        if version is not None and version < SCHEMA_VERSION:
            version = self._migrate(version)
        if version != SCHEMA_VERSION:
            raise JournalError(
                f"journal {self.path} has schema version {version}, but this apportion "
                f"reads version {SCHEMA_VERSION}; use a matching apportion"
            )

    def _migrate(self, version: int) -> int:
        """Bring a journal of an older ``version`` up to date; the version it has now.

        One transaction: another process opening it meanwhile waits, then finds it
        migrated (and migrates nothing)."""
        with self.batch():
            version = self._version() or version  # read again, under the write lock
            while version in MIGRATIONS:
                for statement in MIGRATIONS[version]:
                    self._db.execute(statement)
                version += 1
            self._db.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),)
            )
        return version

    def _version(self) -> int | None:
        """The schema version written in the file; None for a new, empty file."""
        has_meta = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        row = (
            self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if has_meta
            else None
        )
        if row is None:
            return None
        try:
            return int(row[0])
        except ValueError:
            raise JournalError(f"journal {self.path} has a garbled schema version") from None

    def close(self) -> None:
        """Release the journal if claimed and close the file; safe to call twice."""
        self.release()
        self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- transactions ---------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Commit every change made inside as one transaction; nested batches are fine.

        An exception undoes what the batch did (an inner batch only its own part).
        """
        depth = self._depth
        pending = len(self._unlink_on_commit)
        self._db.execute("BEGIN IMMEDIATE" if depth == 0 else f"SAVEPOINT s{depth}")
        self._depth += 1
        try:
            yield
            if depth == 0:
                self._db.execute("COMMIT")
            else:
                self._db.execute(f"RELEASE s{depth}")
        except BaseException:
            del self._unlink_on_commit[pending:]
            if self._db.in_transaction:
                if depth == 0:
                    self._db.execute("ROLLBACK")
                else:
                    self._db.execute(f"ROLLBACK TO s{depth}")
                    self._db.execute(f"RELEASE s{depth}")
            raise
        finally:
            self._depth = depth
        if depth == 0:
            paths, self._unlink_on_commit = self._unlink_on_commit, []
            for path in paths:
                path.unlink(missing_ok=True)

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """Run several reads against one consistent state of the file."""
        if self._depth:
            yield
            return
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    # --- adding and reading runs ----------------------------------------------------

    def stage(self, specs: Sequence[RunSpec], now: float, *, queued: bool = False) -> list[int]:
        """Add runs in one transaction, staged or (``queued=True``) queued; their ids.

        Specs with an ``array_index`` form one array whose ``array_id`` is the id of
        the first of them: one call stages at most one array.
        """
        state, event = (QUEUED, "submitted") if queued else (STAGED, "staged")
        env_ids: dict[int, int] = {}
        ids: list[int] = []
        array_id: int | None = None
        with self.batch():
            for spec in specs:
                env_id = env_ids.get(id(spec.env))
                if env_id is None:
                    env_id = env_ids[id(spec.env)] = self._env_id(spec.env)
                fields = spec.to_dict()
                del fields["env"]
                cursor = self._db.execute(
                    "INSERT INTO runs (name, state, spec, env_id, priority, created,"
                    " array_id, array_index) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        spec.name,
                        state,
                        json.dumps(fields),
                        env_id,
                        spec.priority,
                        now,
                        array_id,
                        spec.array_index,
                    ),
                )
                run_id = _rowid(cursor)
                if spec.array_index is not None and array_id is None:
                    array_id = run_id
                    self._db.execute("UPDATE runs SET array_id = id WHERE id = ?", (run_id,))
                ids.append(run_id)
            self._db.executemany(
                "INSERT INTO history (run_id, time, text) VALUES (?, ?, ?)",
                [(run_id, now, event) for run_id in ids],
            )
        return ids

    def _env_id(self, env: dict[str, str]) -> int:
        """Row of this environment's content, added if new."""
        text = json.dumps(env, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()
        row = self._db.execute("SELECT id FROM environments WHERE digest = ?", (digest,)).fetchone()
        if row is not None:
            return int(row[0])
        return _rowid(
            self._db.execute("INSERT INTO environments (digest, env) VALUES (?, ?)", (digest, text))
        )

    def get(self, run_id: int) -> RunRecord | None:
        """The run with this id, or None."""
        found = self._records("WHERE id = ?", (run_id,))
        return found[0] if found else None

    def runs(
        self,
        *,
        states: Collection[str] | None = None,
        ids: Collection[int] | None = None,
        array_id: int | None = None,
        latest: int | None = None,
    ) -> list[RunRecord]:
        """Runs in any of ``states``, among ``ids``, of the array ``array_id`` and among
        the ``latest`` ones (None: no restriction), by id."""
        where: list[str] = []
        params: list[object] = []
        if states is not None:
            where.append(f"state IN {IN_LIST}")
            params.append(json.dumps(sorted(states)))
        if ids is not None:
            where.append(f"id IN {IN_LIST}")
            params.append(json.dumps(sorted(ids)))
        if array_id is not None:
            where.append("array_id = ?")
            params.append(array_id)
        if latest is not None:
            where.append("id IN (SELECT id FROM runs ORDER BY id DESC LIMIT ?)")
            params.append(latest)
        return self._records(f"WHERE {' AND '.join(where)}" if where else "", params)

    def _records(self, where: str, params: Sequence[object]) -> list[RunRecord]:
        with self._snapshot():
            rows = self._db.execute(
                f"SELECT {COLUMNS} FROM runs {where} ORDER BY id", params
            ).fetchall()
            wanted = json.dumps(sorted({row[4] for row in rows}))
            envs: dict[int, dict[str, str]] = {
                env_id: json.loads(text)
                for env_id, text in self._db.execute(
                    f"SELECT id, env FROM environments WHERE id IN {IN_LIST}", (wanted,)
                )
            }
        return [record_from_row(row, envs[row[4]]) for row in rows]

    def counts(self, ids: Collection[int] | None = None) -> dict[str, int]:
        """How many runs (among ``ids`` if given) are in each state; every state a key."""
        query = "SELECT state, COUNT(*) FROM runs"
        params: tuple[str, ...] = ()
        if ids is not None:
            query += f" WHERE id IN {IN_LIST}"
            params = (json.dumps(sorted(ids)),)
        counts = dict.fromkeys(STATES, 0)
        for state, count in self._db.execute(query + " GROUP BY state", params):
            counts[state] = count
        return counts

    def arrays(self, latest: int) -> list[tuple[int, str, dict[str, int]]]:
        """The ``latest`` arrays, newest first: (array id, name, how many runs in each
        state; every state a key)."""
        with self._snapshot():
            ids = [
                int(row[0])
                for row in self._db.execute(
                    "SELECT DISTINCT array_id FROM runs WHERE array_id IS NOT NULL"
                    " ORDER BY array_id DESC LIMIT ?",
                    (latest,),
                )
            ]
            rows = self._db.execute(
                "SELECT array_id, MAX(name), state, COUNT(*) FROM runs"
                f" WHERE array_id IN {IN_LIST} GROUP BY array_id, state",
                (json.dumps(ids),),
            ).fetchall()
        names: dict[int, str] = {}
        counts: dict[int, dict[str, int]] = {i: dict.fromkeys(STATES, 0) for i in ids}
        for array_id, name, state, count in rows:
            names[array_id] = max(names.get(array_id, ""), name)
            counts[array_id][state] = count
        return [(i, names.get(i, ""), counts[i]) for i in ids]

    def history(self, run_id: int) -> list[tuple[float, str]]:
        """What happened to a run, as (time, text), oldest first."""
        with self._snapshot():
            self._state(run_id)
            rows = self._db.execute(
                "SELECT time, text FROM history WHERE run_id = ? ORDER BY id", (run_id,)
            ).fetchall()
        return [(float(t), str(text)) for t, text in rows]

    def cancel_requests(self) -> list[int]:
        """Runs a user asked to cancel that have not finished yet, by id."""
        rows = self._db.execute(
            "SELECT id FROM runs WHERE cancel_requested = 1"
            f" AND state NOT IN {IN_LIST} ORDER BY id",
            (FINISHED_LIST,),
        )
        return [int(row[0]) for row in rows]

    # --- changes of state -----------------------------------------------------------

    def mark_queued(self, ids: Collection[int], now: float) -> None:
        """Queue staged runs: all of them, or none if one is not staged."""
        with self.batch():
            for run_id in ids:
                self._move(run_id, QUEUED, only_from=STAGED)
                self._db.execute("UPDATE runs SET state = ? WHERE id = ?", (QUEUED, run_id))
                self._note(run_id, "queued", now)

    def mark_running(self, run_id: int, worker: str, held: str, now: float) -> None:
        """A queued run's process started on ``worker`` holding ``held``."""
        with self.batch():
            self._move(run_id, RUNNING)
            self._db.execute(
                "UPDATE runs SET state = ?, worker = ?, held = ?, started = ?,"
                " attempts = attempts + 1, waiting = '' WHERE id = ?",
                (RUNNING, _one_line(worker), _one_line(held), now, run_id),
            )
            attempts = self._db.execute(
                "SELECT attempts FROM runs WHERE id = ?", (run_id,)
            ).fetchone()[0]
            text = f"started on {worker}" + (f" holding {held}" if held else "")
            self._note(run_id, text + (f" (attempt {attempts})" if attempts > 1 else ""), now)

    def mark_ended(
        self,
        run_id: int,
        state: str,
        now: float,
        *,
        exit_code: int | None = None,
        signal: int | None = None,
        reason: str = "",
    ) -> None:
        """A run finished in ``state`` (one of ``FINISHED``): how, and why if not plainly."""
        if state not in FINISHED:
            raise ValueError(f"{state!r} is not a finished state ({', '.join(sorted(FINISHED))})")
        with self.batch():
            self._move(run_id, state)
            self._end(run_id, state, now, exit_code=exit_code, signal=signal, reason=reason)

    def _end(
        self,
        run_id: int,
        state: str,
        now: float,
        *,
        exit_code: int | None = None,
        signal: int | None = None,
        reason: str = "",
    ) -> None:
        reason = _one_line(reason)
        self._db.execute(
            "UPDATE runs SET state = ?, ended = ?, exit_code = ?, signal = ?, reason = ?,"
            " waiting = '' WHERE id = ?",
            (state, now, exit_code, signal, reason, run_id),
        )
        how = describe_exit(exit_code, signal)
        self._note(
            run_id, state + (f" ({how})" if how else "") + (f": {reason}" if reason else ""), now
        )

    def requeue(self, run_id: int, reason: str, now: float, *, preempted: bool = False) -> None:
        """A running run was interrupted (its worker died, say) and is to run again;
        ``preempted``: it was stopped to let another share in, which its history says
        and ``preemptions`` counts (no retry is used)."""
        reason = _one_line(reason)
        with self.batch():
            self._move(run_id, QUEUED, only_from=RUNNING)
            self._db.execute(
                "UPDATE runs SET state = ?, worker = '', held = '', reason = ?,"
                " preemptions = preemptions + ? WHERE id = ?",
                (QUEUED, reason, int(preempted), run_id),
            )
            if not preempted:
                text = f"interrupted: {reason}"
            else:  # the scheduler's reason says "preempted for ..." itself
                text = reason if reason.startswith("preempted") else f"preempted: {reason}"
            self._note(run_id, f"{text}; queued again", now)

    def set_waiting(self, run_id: int, text: str) -> None:
        """Say why a run is not running yet. Cheap: no history, no write if unchanged."""
        text = _one_line(text)
        cursor = self._db.execute(
            "UPDATE runs SET waiting = ? WHERE id = ? AND waiting IS NOT ?",
            (text, run_id, text),
        )
        if cursor.rowcount == 0:
            self._state(run_id)

    def request_cancel(self, run_id: int, now: float) -> str:
        """Ask for a run to be cancelled; says what happened.

        ``"cancelled"``: it was staged, so it is cancelled at once. ``"requested"``:
        it is queued or running, and the scheduler will stop it. ``"finished"``: too
        late, nothing changed. Unknown ids raise ``KeyError``.
        """
        with self.batch():
            state = self._state(run_id)
            if state in FINISHED:
                return "finished"
            asked = self._db.execute(
                "UPDATE runs SET cancel_requested = 1 WHERE id = ? AND cancel_requested = 0",
                (run_id,),
            ).rowcount
            if state == STAGED:
                self._end(run_id, CANCELLED, now, reason="cancelled while staged")
                return "cancelled"
            if asked:
                self._note(run_id, "cancel requested", now)
            return "requested"

    def note(self, run_id: int, text: str, now: float) -> None:
        """Add a line to a run's history."""
        with self.batch():
            self._state(run_id)
            self._note(run_id, text, now)

    def _note(self, run_id: int, text: str, now: float) -> None:
        self._db.execute(
            "INSERT INTO history (run_id, time, text) VALUES (?, ?, ?)",
            (run_id, now, _one_line(text)),
        )

    def _state(self, run_id: int) -> str:
        """State of a run; ``KeyError`` if there is no such run."""
        row = self._db.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id}")
        return str(row[0])

    def _move(self, run_id: int, new: str, *, only_from: str | None = None) -> None:
        """Raise unless the run may go from its state to ``new`` (and is in ``only_from``)."""
        check_run_move(run_id, self._state(run_id), new, only_from)

    # --- removing runs --------------------------------------------------------------

    def remove(self, ids: Collection[int]) -> list[int]:
        """Delete staged and finished runs with their history and logs; the ids removed.

        All or nothing: an unknown id raises ``KeyError``, and a queued or running one
        ``ValueError`` (the scheduler still owns it: cancel it first).
        """
        with self.batch():
            return self._remove(sorted(set(ids)))

    def prune(self, *, older_than: float | None, now: float) -> int:
        """Delete finished runs that ended over ``older_than`` seconds ago (None: all)."""
        if older_than is not None and not older_than >= 0:
            raise ValueError(
                f"older_than must be a non-negative number of seconds, not {older_than}"
            )
        query = f"SELECT id FROM runs WHERE state IN {IN_LIST}"
        params: list[object] = [FINISHED_LIST]
        if older_than is not None:
            query += " AND ended < ?"
            params.append(now - older_than)
        with self.batch():
            ids = [int(row[0]) for row in self._db.execute(query, params)]
            return len(self._remove(ids))

    def _remove(self, ids: list[int]) -> list[int]:
        if not ids:
            return []
        listed = json.dumps(ids)
        states = dict(
            self._db.execute(f"SELECT id, state FROM runs WHERE id IN {IN_LIST}", (listed,))
        )
        unknown = [i for i in ids if i not in states]
        if unknown:
            raise KeyError(f"no {_runs(unknown)}")
        busy = [i for i in ids if states[i] in (QUEUED, RUNNING)]
        if busy:
            one = len(busy) == 1
            raise ValueError(
                f"{_runs(busy)} {'is' if one else 'are'} queued or running: "
                f"cancel {'it' if one else 'them'} first"
            )
        env_ids = json.dumps(
            [
                row[0]
                for row in self._db.execute(
                    f"SELECT DISTINCT env_id FROM runs WHERE id IN {IN_LIST}", (listed,)
                )
            ]
        )
        self._db.execute(f"DELETE FROM history WHERE run_id IN {IN_LIST}", (listed,))
        self._db.execute(f"DELETE FROM runs WHERE id IN {IN_LIST}", (listed,))
        self._db.execute(
            f"DELETE FROM environments WHERE id IN {IN_LIST}"
            " AND NOT EXISTS (SELECT 1 FROM runs WHERE env_id = environments.id)",
            (env_ids,),
        )
        self._unlink_on_commit.extend(self.log_path(i) for i in ids)
        return ids

    # --- output ---------------------------------------------------------------------

    def log_path(self, run_id: int) -> Path:
        """File holding a run's output (stdout and stderr, every attempt)."""
        return self.logs_dir / f"{run_id}.log"

    def append_log(self, run_id: int, data: bytes | bytearray) -> None:
        """Append output to a run's log file, creating the logs directory if need be."""
        path = self.log_path(run_id)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        if not self._logs_checked:
            # Once per journal: a directory others may write to could hold their
            # links in place of our logs. Made if missing, as on first output.
            private_dir(self.logs_dir, "run log directory")
            self._logs_checked = True
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            private_dir(self.logs_dir, "run log directory")
            fd = os.open(path, flags, 0o600)
        with open(fd, "ab") as log:
            log.write(data)

    # --- the scheduler's claim ------------------------------------------------------

    def claim(self, address: str) -> None:
        """Become the one scheduler serving this journal, listening on ``address``.

        Raises ``JournalBusy`` naming the live scheduler that holds it. The claim ends
        with ``release()``, ``close()`` or the death of this process.
        """
        address = _one_line(address)
        if self._lock_fd is None:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            # An owner() probe holds the lock for microseconds: wait that out.
            if not try_flock(fd, fcntl.LOCK_EX, patience=0.1):
                pid, owner_address = read_owner(fd, patience=0.1)
                os.close(fd)
                raise JournalBusy(self.path, pid, owner_address)
            self._lock_fd = fd
        write_owner(self._lock_fd, address)
        self._address = address

    def release(self) -> None:
        """Stop serving the journal (no-op if this object does not hold it)."""
        if self._lock_fd is None:
            return
        fd, self._lock_fd = self._lock_fd, None
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def owner(self) -> tuple[int, str] | None:
        """(pid, address) of the scheduler serving this journal now, or None."""
        if self._lock_fd is not None:
            return os.getpid(), self._address
        try:
            fd = os.open(self._lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return read_owner(fd, patience=0.1) if held(fd) else None
        finally:
            os.close(fd)


def _rowid(cursor: sqlite3.Cursor) -> int:
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _one_line(text: str) -> str:
    """History, reasons and waiting texts are shown one per line."""
    return " ".join(text.split())


def _runs(ids: Sequence[int]) -> str:
    """``"run 3"``, ``"runs 3, 4"``; long lists cut short."""
    shown = ", ".join(map(str, ids[:10]))
    if len(ids) > 10:
        shown += f" ... ({len(ids)} in all)"
    return f"run {shown}" if len(ids) == 1 else f"runs {shown}"
