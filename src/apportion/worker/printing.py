"""``print`` and ``warn`` for task code, seen on every client as well (Dask's names).

A task's output goes to its worker's stdout, which nobody watching a notebook sees.
Called inside a task, these do what the builtins do there and also publish the text
(or the warning) on the ``print`` or ``warn`` topic, which every client subscribes
to as it connects (``client/printing.py``): each client then prints it to its own
stdout or stderr, or emits the warning, as Dask's clients do. Outside a task they
are the builtins.

The message goes to the scheduler on the worker's own connection, through the
outbox that also carries task outcomes: it is flushed before the task's result is
reported, so a client sees what a task printed before it sees the task finish.
"""

from __future__ import annotations

import builtins
import sys
import warnings
from typing import Any, TextIO

from apportion.core import payload
from apportion.protocol.coordination import Publish
from apportion.worker.context import current_worker, in_task

#: The topics Dask's clients show: what tasks printed, and their warnings.
PRINT_TOPIC = "print"
WARN_TOPIC = "warn"

#: Which standard stream a printed text goes to on the client (Dask's numbers).
STDOUT, STDERR = 1, 2


def print(
    *args: Any,
    sep: str | None = " ",
    end: str | None = "\n",
    file: TextIO | None = None,
    flush: bool = False,
) -> None:
    """The builtin ``print``; inside a task, every client connected to the cluster
    prints the same text too (to its stdout, or its stderr for ``file=sys.stderr``).

    Arguments are turned into text with ``str`` here, as the builtin does, so any
    object prints. ``file`` must be ``sys.stdout``, ``sys.stderr`` or None inside a
    task: another file has no counterpart on a client (``TypeError``).
    """
    if in_task():
        message: dict[str, Any] = {
            "args": tuple(str(arg) for arg in args),
            "sep": sep,
            "end": end,
            "flush": flush,
        }
        if file is sys.stdout:
            message["file"] = STDOUT
        elif file is sys.stderr:
            message["file"] = STDERR
        elif file is not None:
            raise TypeError(
                "print inside a task writes to clients too, so file must be None, "
                f"sys.stdout or sys.stderr, not {file!r}"
            )
        _publish(PRINT_TOPIC, message, "print")
    builtins.print(*args, sep=sep, end=end, file=file, flush=flush)


def warn(
    message: str | Warning,
    category: type[Warning] | None = UserWarning,
    stacklevel: int = 1,
    source: Any = None,
) -> None:
    """``warnings.warn``; inside a task, every client connected to the cluster emits
    the same warning too (under its own warning filters). ``stacklevel`` and
    ``source`` apply here only: they mean nothing in a client's process."""
    if in_task():
        _publish(WARN_TOPIC, {"message": message, "category": category}, "warn")
    warnings.warn(message, category, stacklevel=stacklevel + 1, source=source)


def _publish(topic: str, value: dict[str, Any], caller: str) -> None:
    blob, _ = payload.pack_call((value,), {})  # as ``Pub.put`` packs a message
    current_worker(caller).send_threadsafe(Publish(topic, blob))
