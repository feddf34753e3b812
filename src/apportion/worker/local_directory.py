"""A worker process's own scratch directory (where its results spill), and the
clean-up of those left behind by workers that were killed.

Each worker process makes a fresh ``apportion-worker-*`` directory under its base
(Dask's ``local_directory``; the system's temporary directory by default), readable
by its user only (0700), and removes it when it closes. A worker killed with
SIGKILL cannot remove its own, so the next worker started on that base removes it.

Whether a directory's worker is gone is told by a lock, as Dask does: a worker
holds an exclusive ``flock`` on ``<dir>/lock`` for as long as it lives, and the
kernel releases it when the process ends, however it ends. A directory whose lock
can be taken belongs to nobody alive and is removed; one without a lock file is
left alone (its worker may be creating it). The lock file is created under
another name, locked, then renamed into place, so no other worker can ever take
the lock of a live one in between. Only directories of this user are looked at.
``flock`` works across processes of one machine, containers included, but may not
on some network file systems: keep the base on a local disk, as for speed anyway.
Where ``fcntl`` does not exist (Windows), no lock is held and nothing is cleaned.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import weakref
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("apportion.worker")

#: Name of a worker's directory under its base, before the random part.
PREFIX = "apportion-worker-"
#: The file a live worker holds locked inside its directory.
LOCK = "lock"


class LocalDirectory:
    """A fresh directory under ``base`` (None: the system's temporary directory),
    locked while this object lives and removed by ``remove`` (or when collected)."""

    def __init__(self, base: str | os.PathLike[str] | None = None) -> None:
        root = Path(base) if base is not None else Path(tempfile.gettempdir())
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        #: The base the directory is made in (shared with other workers).
        self.base = root
        #: This worker's directory.
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))  # mode 0700
        self._lock_fd = _hold_lock(self.path)
        self._finalizer = weakref.finalize(self, _remove, self.path, self._lock_fd)
        removed = remove_stale(root, keep=self.path)
        if removed:
            logger.info(
                "removed %d directories of workers no longer running from %s", len(removed), root
            )

    def remove(self) -> None:
        """Delete the directory and everything in it; idempotent."""
        self._finalizer()

    @property
    def removed(self) -> bool:
        return not self._finalizer.alive

    def __repr__(self) -> str:
        return f"<LocalDirectory {self.path}>"


def _hold_lock(path: Path) -> int | None:
    """Lock ``path/LOCK`` for as long as the returned descriptor stays open."""
    if fcntl is None:
        return None
    fresh = path / f".{LOCK}-{os.getpid()}"
    fd = os.open(fresh, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(fresh, path / LOCK)  # in place only once locked
    return fd


def _remove(path: Path, lock_fd: int | None) -> None:
    """Delete first, unlock after: nobody may take it for stale while it goes."""
    shutil.rmtree(path, ignore_errors=True)
    if lock_fd is not None:
        os.close(lock_fd)


def remove_stale(base: Path, keep: Path | None = None) -> list[Path]:
    """Remove the worker directories under ``base`` whose worker is gone; returns them.

    Only this user's directories named ``PREFIX*`` (not symbolic links) whose lock
    file exists and can be locked now; anything else is left alone.
    """
    if fcntl is None:
        return []
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    for entry in entries:
        path = Path(entry.path)
        if not entry.name.startswith(PREFIX) or path == keep:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        if _take_if_abandoned(path):
            removed.append(path)
    return removed


def _take_if_abandoned(path: Path) -> bool:
    """Remove ``path`` if its lock can be taken (its worker is gone)."""
    assert fcntl is not None
    try:
        fd = os.open(path / LOCK, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False  # no lock file: being created, or not a worker's
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its worker is alive
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)
