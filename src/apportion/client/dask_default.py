"""While an apportion client is open, Dask's own ``compute`` and ``persist`` run on it.

As with Dask's client (``set_as_default=True``), the newest open client is Dask's
scheduler. A client never imports Dask itself: made before Dask is imported, it
leaves a one-shot import hook that makes the open clients Dask's scheduler the
moment ``import dask`` completes (a script may well make its client first).
Dask's configuration holds ``CURRENT``, a stand-in for whichever client is current,
which Dask's ``get_scheduler`` reads as it reads a client: its ``get`` is the current
client's own ``get`` (so ``dask.base.get_scheduler() == client.get`` inside ``with
client:``, as with Dask's client). It holds no client, so the configuration still
pickles (Dask's process-based clusters copy it) and a forgotten client is still
collected; the clients themselves are held weakly here.

Inside a task, Dask's ``compute`` runs on the task's own thread instead: going back
to the cluster from a worker thread could wait forever for a thread of its own.
Once the task has seceded (``worker_client()``) it goes to the cluster through its
worker's client, as in Dask: the task then holds no thread while it waits. A worker
process (``apportion worker``) names ``CURRENT`` as Dask's scheduler from the start
(``serve_tasks``), with no client of its own, so that these rules hold there too.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.abc
import importlib.util
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from apportion.worker.context import in_task, seceded
from apportion.worker.service import get_worker

if TYPE_CHECKING:
    # Only for the type checker: a worker process runs ``serve_tasks`` and must not
    # load the client's futures for it (they load when a task's compute meets one).
    from apportion.client.future import FutureOwner

    class DefaultClient(FutureOwner, Protocol):
        """What Dask's default scheduler is here: a ``Client``."""

        def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any: ...

        def persist(self, collections: Any, **kwargs: Any) -> Any: ...


#: Open clients that asked to be Dask's default, oldest first.
_clients: list[weakref.ref[DefaultClient]] = []
#: Restores Dask's settings from before the first client (``dask.config.set``).
_setting: Any = None
# Re-entrant: a client collected by the garbage collector leaves from whatever
# thread the collection happens on, possibly one that holds the lock already.
_lock = threading.RLock()


#: This process is a worker's: Dask's scheduler here is ``CURRENT`` for good, client
#: or none, so that a task's compute goes where ``get`` says tasks' computes go.
_serving_tasks = False


def register(client: DefaultClient) -> None:
    """``client`` is Dask's scheduler from now on, until it closes or a newer one opens;
    if Dask is not imported yet, from the moment it is."""
    with _lock:
        _clients.append(weakref.ref(client, _forget))
        _when_dask_is_there()


def serve_tasks() -> None:
    """This process runs a worker: its tasks' Dask computes follow ``get``'s rules
    (on the task's thread; through the worker's client once seceded), from the moment
    Dask is imported, whether or not a client is open here."""
    global _serving_tasks
    with _lock:
        _serving_tasks = True
        _when_dask_is_there()


def _when_dask_is_there() -> None:
    """Become Dask's scheduler now, or once ``import dask`` completes (the lock is held)."""
    if "dask" in sys.modules:
        _become_default()
    elif not any(isinstance(finder, _AfterDaskImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterDaskImport())


def _become_default() -> None:
    """Tell Dask to use ``get``, once, while some client is open (the lock is held)."""
    global _setting
    dask = sys.modules.get("dask")
    if _setting is not None or dask is None or (current() is None and not _serving_tasks):
        return
    # Task-based shuffles: Dask's default on one machine writes to local disk,
    # which workers on other hosts cannot read.
    _setting = dask.config.set({"scheduler": CURRENT, "dataframe.shuffle.method": "tasks"})


def _dask_imported() -> None:
    with _lock:
        _become_default()


class _AfterDaskImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``dask`` so that ``_dask_imported``
    runs right after Dask's package has run. Leaves ``sys.meta_path`` at its first use.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "dask":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the finders after this one
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenRegister(spec.loader)
        return spec


class _ThenRegister(importlib.abc.Loader):
    """Runs the real loader, then makes the open clients Dask's scheduler."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Dask's package sees its own loader, as if this one had never been there.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _dask_imported()


def unregister(client: DefaultClient) -> None:
    """``client`` closed: the newest open client is Dask's scheduler, or none is."""
    with _lock:
        _clients[:] = [ref for ref in _clients if ref() not in (client, None)]
        _restore_if_none_left()


def _forget(ref: weakref.ref[DefaultClient]) -> None:
    with _lock:
        if ref in _clients:
            _clients.remove(ref)
        _restore_if_none_left()


def _restore_if_none_left() -> None:
    global _setting
    dask = sys.modules.get("dask")
    if _clients or _setting is None or dask is None or _serving_tasks:
        return
    # Someone chose another scheduler meanwhile: theirs stays.
    if dask.config.get("scheduler", None) is CURRENT:
        _setting.__exit__(None, None, None)
    _setting = None


#: The client of an ``as_current`` block, in this thread or task (None outside one).
_as_current: contextvars.ContextVar[DefaultClient | None] = contextvars.ContextVar(
    "apportion_as_current", default=None
)


def set_current(client: DefaultClient | None) -> contextvars.Token[DefaultClient | None]:
    """Make ``client`` the current one in this context (``Client.as_current``)."""
    return _as_current.set(client)


def reset_current(token: contextvars.Token[DefaultClient | None]) -> None:
    _as_current.reset(token)


#: What ``enter`` gives and ``leave`` takes back.
Entered: TypeAlias = "contextvars.Token[DefaultClient | None]"


def enter(client: DefaultClient) -> Entered:
    """``with client:`` entered: it is the current client in this thread or task."""
    return _as_current.set(client)


def leave(entered: Entered | None) -> None:
    """``with client:`` left: the current client is the one from before again.
    ``ValueError`` (Python's, as Dask's client raises it) when left in another thread
    or task than the one that entered."""
    if entered is not None:
        _as_current.reset(entered)


def current() -> DefaultClient | None:
    """The client of the enclosing ``as_current`` block, else the newest open client
    that is Dask's default."""
    chosen = _as_current.get()
    if chosen is not None and not chosen._closed:
        return chosen
    with _lock:
        for ref in reversed(_clients):
            client = ref()
            if client is not None and not client._closed:
                return client
    return None


def _seceded_task_client() -> DefaultClient | None:
    """The worker's client, for a task that seceded once it has one (else None)."""
    if not seceded():
        return None
    client: DefaultClient | None = get_worker().task_client
    return None if client is None or client._closed else client


def get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Dask's scheduler function: run on the newest open client."""
    import dask

    if in_task():
        client = _seceded_task_client()
        if client is not None:
            return client.get(dsk, keys, **kwargs)
        # Synchronous, on this task's thread and resources.
        return dask.get(_parts_here(dsk), keys)
    client = current()
    if client is None:  # every client closed since Dask was told to use them
        return dask.threaded.get(dsk, keys, **kwargs)
    if client.asynchronous:
        # Dask's own client fails here too: the results would have to be awaited.
        raise RuntimeError(
            "the default client is asynchronous here (made so, or called from its own "
            "loop, as in client.sync), and Dask's compute() would block the running "
            "event loop: use 'await client.compute(x)' (or 'await "
            "client.gather(client.compute(x))') instead, or compute from a thread "
            "without a running loop (await asyncio.to_thread(x.compute))"
        )
    return client.get(dsk, keys, **kwargs)


def _parts_here(dsk: Any) -> Any:
    """``dsk`` with the futures in it (a persisted collection's parts) replaced by
    their values, which this task's worker holds: they were its inputs.

    Pickled into the task, a collection's futures arrive as their values already.
    But a worker in the client's own process may be handed the client's collection
    itself, futures and all (Dask caches expressions by name), and Dask's local
    scheduler would take each future for its value.
    """
    from apportion.client.future import Future

    graph = dsk if isinstance(dsk, Mapping) else dict(dsk.__dask_graph__())
    parts = {k: v for k, v in graph.items() if isinstance(getattr(v, "value", v), Future)}
    if not parts:
        return dsk
    data = get_worker().data
    here = dict(graph)
    for name, value in parts.items():
        key = getattr(value, "value", value).key
        if key not in data:
            raise RuntimeError(
                f"{key!r}, a part of a persisted collection, is not on this task's worker: "
                "pass the collection to the task as an argument (its parts then come "
                "with it), or compute it inside worker_client()"
            )
        here[name] = data[key]
    return here


def persist(collections: Any, **kwargs: Any) -> Any:
    """Dask's ``persist`` hands over to a scheduler function that has this attribute."""
    import dask

    if in_task():
        client = _seceded_task_client()
        if client is not None:
            return client.persist(list(collections), **kwargs)
        return list(dask.persist(*collections, scheduler="sync", **kwargs))
    client = current()
    if client is None:
        return list(dask.persist(*collections, scheduler="threads", **kwargs))
    return client.persist(list(collections), **kwargs)


get.persist = persist  # type: ignore[attr-defined]


class CurrentClient:
    """What Dask's configuration names as its scheduler while a client is open.

    Dask's ``get_scheduler`` takes anything whose type is named like a client and
    has ``get`` as a client, and uses that ``get``; this one's is the current
    client's bound ``get`` (the ``with client:`` or ``as_current`` one, else the
    newest open default client), or, inside a task that has seceded, its worker's
    client's. Elsewhere (inside a task on its own thread, no client left, an
    asynchronous client) it is the module's ``get``, which knows what to do there.
    Not callable, on purpose: Dask would call it instead of asking for ``get``.
    """

    __slots__ = ()

    #: Dask asks before using ``get``; the module's ``get`` gives apportion's own
    #: error for an asynchronous client instead of Dask's.
    asynchronous = False

    @property
    def get(self) -> Any:
        if in_task():
            client = _seceded_task_client()
        else:
            client = current()
            if client is not None and client.asynchronous:
                client = None
        return get if client is None else client.get

    @property
    def persist(self) -> Any:
        return persist

    def __reduce__(self) -> str:
        return "CURRENT"  # the module's one instance, by name

    def __repr__(self) -> str:
        return "<apportion's current Client>"


#: The one ``CurrentClient``, the value of Dask's ``scheduler`` setting.
CURRENT = CurrentClient()
