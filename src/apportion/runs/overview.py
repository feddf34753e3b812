"""The job queue as the dashboard shows it, read from the journal file.

``JournalOverview`` opens the journal afresh on every call, with a connection of
its own, as ``apportion runs`` does: SQLite's WAL mode lets it read while the
scheduler's job queue writes, and nothing is shared with the queue's thread. Every
call blocks (file and database I/O): the dashboard makes them in a thread.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from apportion.core.resources import describe_spec
from apportion.runs.journal import RUNNING, STATES, Journal, RunRecord, describe_exit

#: Arrays listed, the most recent first.
MAX_ARRAYS = 50
#: Runs listed: the running ones first, then the most recent.
MAX_RECENT = 200
#: Most bytes of a log returned at once.
MAX_TAIL = 1 << 20


class JournalOverview:
    """Reads one journal for the dashboard (``status["runs"]`` and the runs' logs)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def overview(self) -> dict[str, Any]:
        """``{"journal", "counts", "arrays", "recent"}``: see ``docs/dashboard.md``."""
        if not self.path.exists():
            return {
                "journal": str(self.path),
                "counts": dict.fromkeys(STATES, 0),
                "arrays": [],
                "recent": [],
            }
        with Journal(self.path) as journal:
            counts = journal.counts()
            arrays = journal.arrays(MAX_ARRAYS)
            running = journal.runs(states={RUNNING})
            latest = journal.runs(latest=MAX_RECENT)
        shown = sorted(running, key=lambda r: -r.id)[:MAX_RECENT]
        seen = {r.id for r in shown}
        shown += [r for r in reversed(latest) if r.id not in seen][: MAX_RECENT - len(shown)]
        return {
            "journal": str(self.path),
            "counts": counts,
            "arrays": [
                {"id": array_id, "name": name, "total": sum(by_state.values()), **by_state}
                for array_id, name, by_state in arrays
            ],
            "recent": [_run(record) for record in shown],
        }

    def log_tail(self, run_id: int, tail: int) -> bytes | None:
        """The last ``tail`` bytes (at most ``MAX_TAIL``) of run ``run_id``'s output;
        ``b""`` before it wrote any; None if the journal has no such run."""
        if not self.path.exists():
            return None
        with Journal(self.path) as journal:
            if journal.get(run_id) is None:
                return None
            path = journal.log_path(run_id)
        tail = max(0, min(tail, MAX_TAIL))
        try:
            with open(path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - tail))
                return log.read(tail)
        except FileNotFoundError:
            return b""


def _run(record: RunRecord) -> dict[str, Any]:
    spec = record.spec
    return {
        "id": record.id,
        "label": record.label(),
        "state": record.state,
        "command": shlex.join(spec.command),
        # For people to read, as every amount the page shows (``memory=46.6 GiB``).
        "resources": describe_spec(spec.resources),
        "worker": record.worker,
        "held": describe_spec(record.held),
        "attempts": record.attempts,
        "exit": describe_exit(record.exit_code, record.signal),
        "reason": record.reason,
        "waiting": record.waiting,
        "created": record.created,
        "started": record.started,
        "ended": record.ended,
    }
