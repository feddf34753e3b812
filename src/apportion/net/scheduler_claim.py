"""Which running scheduler a scheduler file belongs to: a lock held beside it.

Theory of operation
-------------------
The process that writes a scheduler file (``apportion scheduler``, ``apportion
ssh``) first takes an exclusive ``flock`` on ``<file>.lock`` and holds it for its
whole life. So a second scheduler of the same user cannot take the file over: it
finds the lock held and writes a file of its own (``take_spare``), or refuses when
it was told that file. The kernel drops an flock with the process that held it,
so the file of a scheduler that died (``kill -9``, a reboot) is free, and the
next scheduler takes it over.

Readers (``look``) tell a live file from a stale one without connecting: they take
a shared lock and give it back at once if they can (the file is stale), which holds
the lock for microseconds; a claim waits that long out (``patience``). A lock file
is absent where the file was written by something that takes no lock (a
``Client.write_scheduler_file``, Dask, an older apportion), and a file system may
refuse locks altogether (NFS without a lock daemon): the file is then taken at its
word (``discovery.Liveness.UNKNOWN``).

The lock file holds its owner's ``pid address`` line, for messages. The owner
removes it on exit while still holding it, and a claim checks after locking that
the name still leads to the file it locked, so two owners never hold two different
files of one name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from apportion.file_lock import held, read_owner, try_flock, write_owner
from apportion.home import private_dir
from apportion.net.discovery import Liveness, Sighting
from apportion.net.scheduler_file import (
    SchedulerFileError,
    SchedulerFileMissing,
    read_scheduler_file,
)

#: What the lock file beside a scheduler file is called: the file's name and this.
LOCK_SUFFIX = ".lock"
#: Seconds a claim waits for a reader's probe to give the lock back.
PATIENCE = 0.1
#: Spare files tried for one port before giving up (a shared home across hosts can
#: hold several schedulers of one user on one port number).
MAX_SPARES = 20


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file of the scheduler file at ``path``."""
    return Path(f"{os.fspath(path)}{LOCK_SUFFIX}")


@dataclass(frozen=True, slots=True)
class Holder:
    """The scheduler holding a file, as it wrote itself in the lock (0 and "" until it has)."""

    pid: int
    address: str

    def text(self) -> str:
        return f"the running scheduler at {self.address or '?'} (pid {self.pid or '?'})"


class SchedulerFileBusy(OSError):
    """The scheduler file belongs to another running scheduler; says which."""

    def __init__(self, path: Path, holder: Holder) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"scheduler file {path} belongs to {holder.text()}")


class SchedulerFileClaim:
    """The right to write one scheduler file, held until ``release`` or this process ends.

    ``locked`` is False where the file system refused locks: the file is written all
    the same, as it was before there were locks, and another scheduler may take it.
    """

    def __init__(self, path: Path, fd: int | None) -> None:
        #: The scheduler file this claim is for.
        self.path = path
        self._fd = fd
        self.locked = fd is not None

    @classmethod
    def take(
        cls, path: str | os.PathLike[str], *, patience: float = PATIENCE
    ) -> SchedulerFileClaim:
        """Claim the file at ``path``; ``SchedulerFileBusy`` if a live scheduler holds it."""
        path = Path(path)
        lock = lock_path(path)
        private_dir(path.parent)
        while True:
            # O_NOFOLLOW: a link planted at the lock's name is an error, never followed.
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                got = try_flock(fd, fcntl.LOCK_EX, patience=patience)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    return cls(path, None)
                raise
            if not got:
                holder = Holder(*read_owner(fd))
                os.close(fd)
                raise SchedulerFileBusy(path, holder)
            if _same_file(fd, lock):
                claim = cls(path, fd)
                claim.note("")  # the pid at once; the address once listening
                return claim
            os.close(fd)  # its owner removed it between our open and our lock: again

    def note(self, address: str) -> None:
        """Write who holds the file (this process, listening at ``address``) in the lock."""
        if self._fd is None:
            return
        write_owner(self._fd, " ".join(address.split()))

    def release(self) -> None:
        """Remove the lock file and let it go; idempotent. The scheduler file itself is
        the owner's to remove first (``remove_scheduler_file``)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if _same_file(fd, lock_path(self.path)):
                os.unlink(lock_path(self.path))
        os.close(fd)  # which lets the flock go

    def __enter__(self) -> SchedulerFileClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def take_spare(default: Path, port: int) -> SchedulerFileClaim:
    """A claim on a file of this scheduler's own beside ``default``, whose owner runs:
    ``scheduler-<port>.json``, else ``scheduler-<port>-2.json`` and so on."""
    last: SchedulerFileBusy | None = None
    for n in range(1, MAX_SPARES + 1):
        try:
            return SchedulerFileClaim.take(spare_path(default, port, n))
        except SchedulerFileBusy as busy:
            last = busy
    assert last is not None
    raise last


def spare_path(default: Path, port: int, n: int = 1) -> Path:
    """``scheduler-8790.json`` beside ``scheduler.json``; ``scheduler-8790-2.json`` for n=2."""
    suffix = f"-{port}" if n == 1 else f"-{port}-{n}"
    return default.with_name(f"{default.stem}{suffix}{default.suffix}")


def look(path: str | os.PathLike[str]) -> Sighting:
    """What the scheduler file at ``path`` says and whether the scheduler that wrote it
    still runs (its lock is held)."""
    path = Path(path)
    liveness = probe(path)
    try:
        return Sighting(path, read_scheduler_file(path), liveness)
    except SchedulerFileMissing:
        return Sighting(path, None, liveness)
    except SchedulerFileError as exc:
        return Sighting(path, None, liveness, str(exc))


def probe(path: str | os.PathLike[str]) -> Liveness:
    """Whether a live process holds the claim on the scheduler file at ``path``."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Liveness.UNKNOWN
    except OSError:
        return Liveness.UNKNOWN  # a link in its place, or unreadable: not ours to judge
    try:
        return Liveness.LIVE if held(fd) else Liveness.STALE
    except OSError:
        return Liveness.UNKNOWN  # the file system refuses locks
    finally:
        os.close(fd)


def holder_of(path: str | os.PathLike[str]) -> Holder | None:
    """The live scheduler holding the file at ``path``, as it wrote itself; None if none."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return Holder(*read_owner(fd)) if held(fd) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def own_scheduler_files(default: Path) -> list[Path]:
    """``default`` and the spare files beside it (``scheduler-*.json``), in name order."""
    spares = sorted(default.parent.glob(f"{default.stem}-*{default.suffix}"))
    return [default, *(p for p in spares if not p.name.startswith("."))]


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def own_sightings(default: Path) -> list[Sighting]:
    """``look`` at ``default`` and at every spare file beside it."""
    return [look(path) for path in own_scheduler_files(default)]
