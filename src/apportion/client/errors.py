"""Exceptions a client raises for failures that are not the task's own exception."""

from __future__ import annotations

import concurrent.futures


class UnsatisfiableError(RuntimeError):
    """No worker of a cluster that cannot grow offers what the task asks for."""


class UnknownResourceError(UnsatisfiableError, ValueError):
    """The task names a resource no connected worker offers, where one offers a name
    that differs only in case or by a typo: the message says "did you mean ...?".

    Raised at once, on any cluster: a misspelt name would otherwise wait for a worker
    that offers it, which most likely never comes. Also a ``ValueError`` (the request
    is wrong, not the cluster) and an ``UnsatisfiableError`` (nothing can run it).
    """


class FutureCancelledError(concurrent.futures.CancelledError):
    """The task was cancelled before it produced a result."""


class LostDataError(RuntimeError):
    """A result or scattered value is gone and cannot be recomputed."""


class SerializationError(RuntimeError):
    """A result exists on a worker but cannot be pickled to travel to where it is needed."""


class WorkerCrashedError(RuntimeError):
    """The task was running on several workers that died: it is the likely cause.

    The message says how each worker was lost. Raise the limit with the scheduler's
    ``max_worker_deaths`` if the deaths had another cause.
    """


class OutOfMemoryError(MemoryError):
    """The task's result is too large for the memory of the workers that must hold it.

    Either the worker that computed it found it above what it keeps (near its
    memory limit), or the workers holding it died out of memory while sending it,
    ``max_worker_deaths`` times. The message names the result's size and the limit.
    Run the task on workers with more memory, or make smaller results.
    """


class SchedulerGoneError(LostDataError, ConnectionError):
    """The connection to the scheduler closed while results were still awaited.

    Also a ``LostDataError``: the results the client was waiting for are out of its
    reach, and code written for that error keeps catching this one.
    """


def failure(kind: str, message: str) -> BaseException:
    """The exception for a scheduler-side failure of the given kind."""
    if kind == "unsatisfiable":
        return UnsatisfiableError(message)
    if kind == "misnamed":
        return UnknownResourceError(message)
    if kind == "cancelled":
        return FutureCancelledError(message)
    if kind == "lost":
        return LostDataError(message)
    if kind == "gone":
        return SchedulerGoneError(message)
    if kind == "unserializable":
        return SerializationError(message)
    if kind == "crashed":
        return WorkerCrashedError(message)
    if kind == "memory":
        return OutOfMemoryError(message)
    return RuntimeError(f"{kind}: {message}")
