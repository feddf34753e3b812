"""Where apportion keeps a user's files, and how it writes the private ones.

``$APPORTION_HOME`` (else ``~/.apportion``) holds the run journal, the cluster's
secret and the default scheduler file. It is created readable by its owner only,
and so is every file with a secret in it: on a shared login node the other users
must not read them. A private file that others *can* read is refused when read,
as ssh refuses a key file open to others, rather than trusted.
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


def private_dir(path: Path) -> Path:
    """``path`` as a directory, created (with its parents) readable by its owner only.

    An existing directory keeps its mode: the user may have chosen to share it.
    """
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, mode 0600, atomically: a reader sees the old file or
    the whole new one, never a half-written secret."""
    private_dir(path.parent)
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
    be read or if its group or others may read or write it."""
    try:
        with open(path) as file:
            mode = os.fstat(file.fileno()).st_mode
            text = file.read()
    except OSError as exc:
        raise PrivateFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
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
