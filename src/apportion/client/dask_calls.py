"""Dask's collections on a client: ``get`` (Dask's scheduler function), ``compute``
and ``persist``. Each lowers what it is given to one graph and hands it to the
client's ``_submit_graph``; the client is a ``GraphSubmitter`` here, nothing more.
``normalize_collection`` puts the client's futures into a collection's graph."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from apportion.client import shapes
from apportion.client.future import Future, FutureOwner, KeyState
from apportion.client.graph import flatten_keys, wire_key
from apportion.client.restrictions import Where, refuse_actors, where_to_run
from apportion.core.resources import ResourceSpec
from apportion.core.tracebacks import raises_user_frames


class GraphSubmitter(Protocol):
    """What these calls need of a client (a ``Client``)."""

    def _submit_graph(
        self,
        dsk: Mapping[Any, Any],
        keys: Any,
        resources: ResourceSpec | Mapping[Any, ResourceSpec],
        priority: int,
        retries: int,
        annotations: Mapping[str, Mapping[Any, Any]],
        where: Where = ...,
    ) -> dict[Any, Future]: ...

    def gather(
        self,
        futures: Any,
        errors: str = "raise",
        direct: bool | None = None,
        asynchronous: bool | None = None,
    ) -> Any: ...


@raises_user_frames
def get(
    client: GraphSubmitter,
    dsk: Mapping[Any, Any],
    keys: Any,
    workers: Any = None,
    allow_other_workers: bool | None = None,
    *,
    resources: ResourceSpec | Mapping[Any, ResourceSpec] = None,
    priority: int = 0,
    retries: int | None = 0,
    actors: bool | None = None,
    **dask_options: Any,
) -> Any:
    """Compute a graph and return ``keys``: an old-style one (``{"x": 1, "y": (add,
    "x", 2)}``), a graph of Dask task nodes, or the expression ``dask.compute``
    hands its scheduler (``dask.compute(x, scheduler=client.get)``).

    ``keys`` may be one key or nested lists of keys; the result has the same
    shape. ``resources`` is one demand for every task, or a mapping from keys
    (or tuples of keys) to demands; ``dask.annotate`` annotations override both.
    Options meant for Dask's local schedulers (``num_workers=``, ...) are ignored,
    as Dask's own client does. ``workers=`` and ``allow_other_workers=`` apply to
    every task, as in ``submit``, except where ``dask.annotate`` said otherwise.
    """
    refuse_actors(actors)
    where = where_to_run(workers, allow_other_workers, strict=False)
    annotations: dict[str, dict[Any, Any]] = {}
    if not isinstance(dsk, Mapping) and hasattr(dsk, "__dask_graph__"):
        from apportion.client.collections import expression_graph

        dsk, annotations = expression_graph(dsk)
    futures = client._submit_graph(dsk, keys, resources, priority, retries or 0, annotations, where)
    try:
        gathered = client.gather(shapes.shaped(keys, futures))
    except BaseException:
        _release(futures)
        raise
    if inspect.isawaitable(gathered):  # an asynchronous client: released once awaited
        return _released_after(gathered, futures)
    _release(futures)
    return gathered


def _release(futures: Mapping[Any, Future]) -> None:
    """Let go of a ``get``'s futures as it returns or raises, as Dask's does: the
    traceback of its error would otherwise keep them, and the work nobody waits for
    any more (the graph's other keys, after one failed) would go on counting as
    the cluster's work."""
    for future in futures.values():
        future.release()


async def _released_after(gathered: Awaitable[Any], futures: Mapping[Any, Future]) -> Any:
    try:
        return await gathered
    finally:
        _release(futures)


def compute(
    client: GraphSubmitter,
    collections: Any,
    *,
    sync: bool = False,
    optimize_graph: bool = True,
    workers: Any = None,
    allow_other_workers: bool | None = False,
    resources: ResourceSpec | Mapping[Any, ResourceSpec] = None,
    retries: int | None = 0,
    priority: int = 0,
    fifo_timeout: Any = "60s",
    actors: bool | None = None,
) -> Any:
    """Start computing Dask collections; a future of each one's final value.

    One collection gives one future, a list gives a list (anything in it that is
    not a Dask collection comes back as it is). ``sync=True`` returns the values
    instead (awaitable, for an asynchronous client). ``resources``, ``priority``,
    ``retries``, ``workers`` and
    ``allow_other_workers`` apply to every task of the graph, except where
    ``dask.annotate`` said otherwise. ``fifo_timeout`` has no effect, as in
    ``submit``.
    """
    from apportion.client.collections import is_collection, lower

    refuse_actors(actors)
    where = where_to_run(workers, allow_other_workers, strict=False)
    items, single = shapes.one_or_many(collections)
    dask_ones = [c for c in items if is_collection(c)]
    futures: dict[Any, Future] = {}
    names: list[Any] = []
    if dask_ones:
        lowered = lower(
            dask_ones, optimize_graph=optimize_graph, finalize=True, resources=resources
        )
        names = list(flatten_keys(lowered.keys))
        futures = client._submit_graph(
            lowered.graph, names, resources, priority, retries or 0, lowered.annotations, where
        )
    outputs = iter(names)
    result = [futures[next(outputs)] if is_collection(c) else c for c in items]
    if sync:  # an awaitable of the values, for an asynchronous client
        return client.gather(result[0] if single else result)
    return result[0] if single else result


def persist(
    client: GraphSubmitter,
    collections: Any,
    *,
    optimize_graph: bool = True,
    workers: Any = None,
    allow_other_workers: bool | None = None,
    resources: ResourceSpec | Mapping[Any, ResourceSpec] = None,
    priority: int = 0,
    retries: int | None = 0,
    actors: bool | None = None,
    **dask_options: Any,
) -> Any:
    """Start computing Dask collections; the same collections, now made of futures.

    Their parts stay on the workers; computing the returned collections, or new
    ones built from them, starts from those parts instead of from scratch.
    Options meant for Dask's local schedulers are ignored, as in ``get``;
    ``workers=`` and ``allow_other_workers=`` restrict every task, as in ``get``.
    """
    from apportion.client.collections import is_collection, lower

    refuse_actors(actors)
    where = where_to_run(workers, allow_other_workers, strict=False)
    items, single = shapes.one_or_many(collections)
    for item in items:
        if not is_collection(item):
            raise TypeError(f"persist takes Dask collections, not {type(item).__name__}")
    lowered = lower(items, optimize_graph=optimize_graph, finalize=False, resources=resources)
    futures = client._submit_graph(
        lowered.graph,
        lowered.keys,
        resources,
        priority,
        retries or 0,
        lowered.annotations,
        where,
    )
    result = []
    for item, keys in zip(items, lowered.keys, strict=True):
        rebuild, extra = item.__dask_postpersist__()
        # The graph holds the futures themselves, as Dask's: ``futures_of`` finds
        # them, and pickled into a task each stands for its part's value there.
        parts = {key: futures[key] for key in flatten_keys(keys)}
        result.append(rebuild(parts, *extra))
    return result[0] if single else result


class Holder(FutureOwner, Protocol):
    """What ``normalize_collection`` needs of a client (a ``Client``): its futures."""

    @property
    def _lock(self) -> threading.RLock: ...

    @property
    def _waiting(self) -> dict[str, KeyState]: ...


def normalize_collection(client: Holder, collection: Any) -> Any:
    """A copy of the Dask ``collection`` whose graph takes each result this client
    holds a future of from that future, as Dask's ``normalize_collection``: parts
    computed (or on their way) are not computed again, and the tasks only they
    needed are left out. ``collection`` itself is not changed; with nothing in
    common, it comes back as it is."""
    from dask.optimization import cull

    graph = collection.__dask_graph__()
    with client._lock:  # a future dropped meanwhile would be made here for nothing
        held = {
            key: Future(wire_key(key), client) for key in graph if wire_key(key) in client._waiting
        }
    if not held:
        return collection
    culled, _ = cull({**dict(graph), **held}, list(flatten_keys(collection.__dask_keys__())))
    rebuild, extra = collection.__dask_postpersist__()
    return rebuild(culled, *extra)
