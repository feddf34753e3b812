"""Where apportion keeps a user's files, and how it writes the private ones.

``$APPORTION_HOME`` (else ``~/.apportion``) holds the run journal, the cluster's
secret and the default scheduler file. It is created readable by its owner only,
and so is every file with a secret in it: on a shared login node the other users
must not read them. A private file that others *can* read, or that another user
owns, is refused when read, as ssh refuses such a key file, rather than trusted.

So is a directory of apportion's own (the home, a journal's logs, a job's
``.apportion``) that another user owns or may write to: whoever can write there
can put a scheduler file of theirs in place of ours, and a worker reading it would
run their code. A symbolic link is followed only if it is ours (or root's); files
are created with ``O_EXCL`` or ``O_NOFOLLOW``, never through a link planted in
their place.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


class PrivateFileError(OSError):
    """A file holding a secret cannot be read, or others may read it too."""


def default_home() -> Path:
    """Where apportion keeps its files: ``$APPORTION_HOME``, else ``~/.apportion``."""
    home = os.environ.get("APPORTION_HOME")
    return Path(home) if home else Path.home() / ".apportion"


def home_dir() -> Path:
    """``default_home()``, made if missing; ``PrivateFileError`` if it is not the
    user's own (``private_dir``)."""
    return private_dir(default_home(), "apportion home")


def private_dir(path: Path, what: str = "directory") -> Path:
    """``path``, a directory of apportion's own, created (with its parents) readable
    by its owner only; ``PrivateFileError`` in one line if it exists but belongs to
    another user, others may write to it, or it is another user's symbolic link.

    An existing directory that passes keeps its mode (``chmod 750`` to let a group
    read logs is the user's choice); one others may write to is refused, as ssh
    refuses a ``~/.ssh`` others may write to.
    """
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    check_private_dir(path, what)
    return path


def check_private_dir(path: Path, what: str = "directory") -> None:
    """Refuse ``path`` unless it is a directory of this user's that nobody else may
    write to, reached through no other user's symbolic link (see ``private_dir``)."""
    me = os.geteuid()
    try:
        link = os.lstat(path)
        info = os.stat(path)
    except OSError as exc:
        raise PrivateFileError(f"cannot use {what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise PrivateFileError(
            f"{what} {path} is a symbolic link of another user (uid {link.st_uid}): "
            "remove it, or use a directory of your own"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise PrivateFileError(f"{what} {path} is not a directory")
    if info.st_uid != me:
        raise PrivateFileError(
            f"{what} {path} belongs to another user (uid {info.st_uid}): "
            "use a directory of your own (APPORTION_HOME)"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PrivateFileError(
            f"{what} {path} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): run `chmod go-w {path}`"
        )


def user_dir(path: Path) -> Path:
    """``path``, a directory the user named (a scheduler file's, a journal's, a log
    directory), created with its parents readable by its owner only if missing; an
    existing one is the user's choice and is taken as it is."""
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, mode 0600, atomically: a reader sees the old file or
    the whole new one, never a half-written secret. A symbolic link at ``path`` is
    replaced, not followed."""
    user_dir(path.parent)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:  # mkstemp makes it 0600 already
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def read_private(path: Path, what: str) -> str:
    """The text of ``path``, a file holding ``what``; ``PrivateFileError`` if it cannot
    be read, if another user owns it, or if its group or others may read or write it."""
    try:
        with open(path) as file:
            info = os.fstat(file.fileno())
            text = file.read()
    except OSError as exc:
        raise PrivateFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    mode = info.st_mode
    if info.st_uid != os.geteuid():
        raise PrivateFileError(
            f"{what} {path} belongs to another user (uid {info.st_uid}): it cannot be trusted"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PrivateFileError(
            f"{what} {path} is open to other users (mode {stat.S_IMODE(mode):04o}): "
            f"run `chmod 600 {path}`"
        )
    return text


def make_private(path: Path) -> None:
    """Take group and other permissions off ``path`` (a journal or log the process made)."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) & 0o700)
