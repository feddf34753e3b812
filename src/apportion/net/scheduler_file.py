"""The scheduler file: where a scheduler is and what it takes to connect, in one file.

``apportion scheduler`` writes one (``--scheduler-file F``; by default
``$APPORTION_HOME/scheduler.json``); ``apportion worker --scheduler-file F``,
``Client(scheduler_file=F)`` and the other commands read it. It is JSON in the shape
of Dask's (``type``, ``id``, ``address``) plus the cluster's ``token``, so it is
private to its owner, like the secret itself: give it to a colleague and you give
them your cluster. On a shared file system it is how the processes of one job find
each other.

A cluster with credentials made for it alone (``apportion ssh``, ``SSHCluster``) also
writes a client's TLS credentials in it (``tls``: CA, certificate and key as PEM
text), so that the file is still all a client needs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.home import PrivateFileError, home_dir, read_private, write_private

#: The file ``apportion scheduler`` writes when not told where.
DEFAULT_NAME = "scheduler.json"


def default_scheduler_file() -> Path:
    """``$APPORTION_HOME/scheduler.json`` (``PrivateFileError`` if that home is not the
    user's own)."""
    return home_dir() / DEFAULT_NAME


class SchedulerFileError(OSError):
    """A scheduler file that cannot be read, is open to others, or is not one."""


class SchedulerFileMissing(SchedulerFileError):
    """No scheduler file at the path (yet)."""


@dataclass(frozen=True, slots=True)
class SchedulerFile:
    """What a scheduler file says."""

    address: str
    #: The cluster's secret; None in a file written without one (Dask's).
    token: str | None
    #: The scheduler's id and process, to tell a stale file from a live one.
    id: str = ""
    pid: int = 0
    #: A client's TLS credentials (PEM text or paths); None in most files, whose
    #: clients find theirs in their environment.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    #: The scheduler's dashboard (base URL, no login token); None if it serves none.
    dashboard: str | None = None


def write_scheduler_file(
    path: str | os.PathLike[str],
    address: str,
    token: str,
    id: str,
    *,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    dashboard: str | None = None,
    pid: int | None = None,
) -> None:
    """Write the file for the scheduler at ``address`` (mode 0600, atomically), with a
    client's TLS credentials and the dashboard's URL if given. ``pid``: the
    scheduler's process, this one unless said (0 for a person's credential file,
    which names no process: ``apportion user add``)."""
    document: dict[str, Any] = {
        "type": "Scheduler",
        "id": id,
        "address": address,
        "token": token,
        "pid": os.getpid() if pid is None else pid,
        "started": time.time(),
    }
    if tls_ca or tls_cert or tls_key:
        document["tls"] = {"ca": tls_ca, "cert": tls_cert, "key": tls_key}
    if dashboard:
        document["dashboard"] = dashboard
    write_private(Path(path), json.dumps(document, indent=2) + "\n")


def read_scheduler_file(path: str | os.PathLike[str]) -> SchedulerFile:
    """What the file at ``path`` says; ``SchedulerFileError`` in one line if it cannot be
    used. A leading ``~`` is the user's home, as in Dask's ``scheduler_file``."""
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        raise SchedulerFileMissing(
            f"no scheduler file at {path}: is the scheduler running, and was it given "
            "this --scheduler-file?"
        )
    try:
        text = read_private(Path(path), "scheduler file")
    except PrivateFileError as exc:
        raise SchedulerFileError(str(exc)) from None
    try:
        document: Any = json.loads(text)
    except ValueError as exc:
        raise SchedulerFileError(f"scheduler file {path} is not JSON: {exc}") from None
    address = document.get("address") if isinstance(document, dict) else None
    if not isinstance(address, str) or not address:
        raise SchedulerFileError(f"scheduler file {path} names no address")
    token = document.get("token")
    tls = document.get("tls")
    tls = tls if isinstance(tls, dict) else {}
    return SchedulerFile(
        address,
        token if isinstance(token, str) and token else None,
        str(document.get("id", "")),
        int(document.get("pid", 0) or 0),
        tls_ca=_text(tls.get("ca")),
        tls_cert=_text(tls.get("cert")),
        tls_key=_text(tls.get("key")),
        dashboard=_text(document.get("dashboard")),
    )


#: Seconds between looks for a scheduler file that is not there yet.
POLL_INTERVAL = 0.2


def wait_for_scheduler_file(
    path: str | os.PathLike[str],
    timeout: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> SchedulerFile:
    """What the file at ``path`` says, once it exists, waiting up to ``timeout`` seconds.

    A batch job starts the scheduler and its workers at once (``srun`` on every node):
    the workers must wait for the scheduler to write its file rather than fail because
    they came first. Only a missing file is waited for; one that exists but cannot be
    used fails at once, since waiting would not mend it.
    """
    deadline = clock() + timeout
    while True:
        try:
            return read_scheduler_file(path)
        except SchedulerFileMissing as exc:
            left = deadline - clock()
            if left <= 0:
                waited = f" after waiting {timeout:g} s" if timeout > 0 else ""
                raise SchedulerFileMissing(f"{exc}{waited}") from None
            sleep(min(POLL_INTERVAL, left))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def remove_scheduler_file(path: str | os.PathLike[str], id: str) -> None:
    """Remove the file at ``path`` if it is still the one of scheduler ``id`` (another
    scheduler may have taken the name since)."""
    try:
        if read_scheduler_file(path).id == id:
            os.unlink(path)
    except OSError:
        pass
