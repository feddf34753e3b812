"""While an apportion client is open, Dask's own ``compute`` and ``persist`` run on it.

As with Dask's client (``set_as_default=True``), the newest open client is Dask's
scheduler. Only once Dask is imported: a client never imports Dask itself. Dask's
configuration holds ``get``, a plain function, so the configuration still pickles
(Dask's process-based clusters copy it) and a forgotten client is still collected;
the clients themselves are held weakly here.

Inside a task, Dask's ``compute`` runs on the task's own thread instead: going back
to the cluster from a worker thread could wait forever for a thread of its own.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from apportion.worker.context import in_task

if TYPE_CHECKING:
    from apportion.client.client import Client

#: Open clients that asked to be Dask's default, oldest first.
_clients: list[weakref.ref[Client]] = []
#: Restores Dask's settings from before the first client (``dask.config.set``).
_setting: Any = None
# Re-entrant: a client collected by the garbage collector leaves from whatever
# thread the collection happens on, possibly one that holds the lock already.
_lock = threading.RLock()


def register(client: Client) -> None:
    """``client`` is Dask's scheduler from now on, until it closes or a newer one opens."""
    global _setting
    dask = sys.modules.get("dask")
    if dask is None:
        return
    with _lock:
        if _setting is None:
            # Task-based shuffles: Dask's default on one machine writes to local disk,
            # which workers on other hosts cannot read.
            _setting = dask.config.set({"scheduler": get, "dataframe.shuffle.method": "tasks"})
        _clients.append(weakref.ref(client, _forget))


def unregister(client: Client) -> None:
    """``client`` closed: the newest open client is Dask's scheduler, or none is."""
    with _lock:
        _clients[:] = [ref for ref in _clients if ref() not in (client, None)]
        _restore_if_none_left()


def _forget(ref: weakref.ref[Client]) -> None:
    with _lock:
        if ref in _clients:
            _clients.remove(ref)
        _restore_if_none_left()


def _restore_if_none_left() -> None:
    global _setting
    dask = sys.modules.get("dask")
    if _clients or _setting is None or dask is None:
        return
    # Someone chose another scheduler meanwhile: theirs stays.
    if dask.config.get("scheduler", None) is get:
        _setting.__exit__(None, None, None)
    _setting = None


def current() -> Client | None:
    """The newest open client that is Dask's default."""
    with _lock:
        for ref in reversed(_clients):
            client = ref()
            if client is not None and not client._closed:
                return client
    return None


def get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Dask's scheduler function: run on the newest open client."""
    import dask

    if in_task():
        return dask.get(dsk, keys)  # synchronous, on this task's thread and resources
    client = current()
    if client is None:  # every client closed since Dask was told to use them
        return dask.threaded.get(dsk, keys, **kwargs)
    return client.get(dsk, keys, **kwargs)


def persist(collections: Any, **kwargs: Any) -> Any:
    """Dask's ``persist`` hands over to a scheduler function that has this attribute."""
    import dask

    if in_task():
        return list(dask.persist(*collections, scheduler="sync", **kwargs))
    client = current()
    if client is None:
        return list(dask.persist(*collections, scheduler="threads", **kwargs))
    return client.persist(list(collections), **kwargs)


get.persist = persist  # type: ignore[attr-defined]
