"""Code run on workers outside tasks: client -> scheduler -> worker and back.

A client asks the scheduler to run a call, install a file or a plugin, or remove
one (``CallOnWorkers``, ``InstallOnWorkers``, ``UninstallFromWorkers``); the scheduler
relays it to each worker (``RemoteCall``, ``Install``, ``Uninstall``), gathers their
``CallAnswered`` and answers once (``WorkersAnswered``). One conversation, both legs.
"""

from __future__ import annotations

from typing import Any

from apportion.core.payload import Pickled
from apportion.protocol.base import Message, message

#: ``request_id`` of a call nobody waits for (``run(wait=False)``, the uploads and
#: plugins replayed to a worker that joins): its answers are dropped, not relayed.
NO_REPLY = 0


@message(65)
class CallOnWorkers(Message):
    """Client -> scheduler: run a pickled ``(function, args, kwargs)`` on workers."""

    request_id: int
    call: bytes
    workers: list[str]  #: names or addresses; empty: every worker


@message(66)
class InstallOnWorkers(Message):
    """Client -> scheduler: a file or a worker plugin for every worker, present and future.

    The scheduler keeps ``blob`` (bounded) and replays it to each worker that joins.
    """

    request_id: int
    kind: str  #: "upload" (``name`` is the file name) or "plugin"
    name: str
    blob: bytes  #: the file's bytes, or the pickled plugin
    load: int  #: uploads: 1 imports (or reloads) what the file holds
    replace: int  #: 0: keep an install of the same name instead (Dask's ``idempotent``)


@message(67)
class UninstallFromWorkers(Message):
    """Client -> scheduler: remove a worker plugin everywhere (its ``teardown`` runs)."""

    request_id: int
    name: str


@message(68)
class WorkersAnswered(Message):
    """Scheduler -> client: each worker's answer to a call, install or uninstall."""

    request_id: int
    #: worker address -> [status, value, traceback]; status "ok" (value: pickled
    #: result), "error" (value: pickled exception) or "lost" (value: why, as text).
    results: dict[str, list[Any]]
    error: str  #: non-empty when the scheduler refused the request as a whole


@message(69)
class RemoteCall(Message):
    """Scheduler -> worker: run this pickled call outside the task threads."""

    request_id: int
    call: bytes


@message(70)
class Install(Message):
    """Scheduler -> worker: write (and load) an uploaded file, or set up a plugin."""

    request_id: int
    kind: str
    name: str
    blob: bytes
    load: int


@message(71)
class Uninstall(Message):
    """Scheduler -> worker: tear down and forget the plugin ``name``."""

    request_id: int
    name: str


@message(72)
class CallAnswered(Message):
    """Worker -> scheduler: how a ``RemoteCall``, ``Install`` or ``Uninstall`` went."""

    request_id: int
    status: str  #: "ok" or "error"
    value: Pickled  #: the result, or the exception
    traceback: Pickled  #: pickled traceback of an error (empty when ok)
