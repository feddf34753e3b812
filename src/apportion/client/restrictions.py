"""Dask's scheduling keywords that are not resources: where a task may run, and
``actors=`` on graphs.

``workers=`` names workers by address (``tcp://10.0.0.5:40123``, with or without
the scheme), by name, or by host (every worker on it); one of those or a list.
The scheduler matches the names when it places the task, so a worker that joins
later counts. ``allow_other_workers=True`` (Dask's old name: ``loose_restrictions``)
makes the names a preference instead of a rule.
"""

from __future__ import annotations

from numbers import Number
from typing import Any

Where = tuple[list[str], int]
"""Where tasks may run, as ``TaskSpec`` carries it: (names, allow_other_workers 0/1)."""

#: No restriction: any worker.
ANYWHERE: Where = ([], 0)


def where_to_run(
    workers: Any,
    allow_other_workers: bool | None = False,
    loose_restrictions: bool | None = None,
    *,
    strict: bool = True,
) -> Where:
    """Check and normalise ``workers=`` and ``allow_other_workers=`` as Dask takes them.

    ``strict`` refuses ``allow_other_workers=True`` without ``workers=``, as Dask's
    ``submit`` and ``map`` do; its ``compute`` and ``persist`` let it pass unused.
    """
    for name, flag in (
        ("allow_other_workers", allow_other_workers),
        ("loose_restrictions", loose_restrictions),
    ):
        if flag not in (True, False, None):
            raise TypeError(f"{name}= must be True or False, not {flag!r}")
    loose = bool(allow_other_workers or loose_restrictions)
    names = worker_names(workers)
    if not names:
        if loose and strict and workers is None:
            raise ValueError("Only use allow_other_workers= if using workers=")
        return ANYWHERE
    return names, int(loose)


def worker_names(workers: Any) -> list[str]:
    """``workers=`` as a sorted list of strings: one name, or a list, tuple or set."""
    if workers is None:
        return []
    if isinstance(workers, str | Number):
        workers = [workers]
    if not isinstance(workers, list | tuple | set | frozenset):
        raise TypeError(
            "workers= takes a worker address, name or host, or a list of them, "
            f"not {type(workers).__name__}"
        )
    names = set()
    for item in workers:
        if not isinstance(item, str | Number) or isinstance(item, bool):
            raise TypeError(f"workers=: {item!r} is not a worker address, name or host")
        names.add(str(item))
    return sorted(names)


def refuse_actors(actors: bool | None) -> None:
    """``actors=`` on a graph (``compute``, ``persist``, ``get``) would make its
    tasks' results actors; apportion makes actors with ``submit``: say so at once."""
    if actors:
        raise NotImplementedError(
            "actors= on a graph is not supported: make an actor with "
            "client.submit(SomeClass, actor=True) and pass its handle to the graph's tasks"
        )
