"""Tasks that use the cluster: ``get_client`` and ``worker_client``, with Dask's names.

A task submits subtasks through its worker's client: one per worker, made by the
first task that asks and shared by every task there (each task making its own would
cost a connection and a thread per task). A task that waits on what it submitted
should secede first (``worker_client()`` does): its thread, and its resources unless
it keeps them, go to other tasks meanwhile; see ``apportion.worker.context.secede``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from apportion.client import actors, dask_default
from apportion.client.client import Client, default_client
from apportion.core.durations import Duration
from apportion.worker.context import in_task, rejoin, secede, seceded
from apportion.worker.service import get_worker

if TYPE_CHECKING:
    from apportion.worker.service import Worker


def worker_client_of(worker: Worker, timeout: Duration | None = None) -> Client:
    """The client the tasks of ``worker`` share, made on first use (or again, once the
    one made before lost its scheduler)."""
    with worker.task_client_lock:
        client = worker.task_client
        if client is None or client._closed or not client._session.connected:
            client = Client(
                worker.scheduler_address,
                name=f"{worker.name}-tasks",
                set_as_default=False,
                timeout=30.0 if timeout is None else timeout,
                security=worker.security,  # the worker's own credentials, TLS included
                # A worker reaches its peers' data ports (it fetches inputs there):
                # its tasks' data goes straight to them, as Dask's worker client's.
                direct_to_workers=True,
            )
            worker.task_client = client
        return client  # type: ignore[no-any-return]  # the worker types it Any


def get_client(
    address: str | None = None, timeout: Duration | None = None, resolve_address: bool = True
) -> Client:
    """The client to submit work with, as Dask's ``get_client``.

    Inside a task: its worker's client, shared by the tasks there. Outside one: the
    default client (the newest open one); with ``address``, a client of that
    scheduler (the default one if it is connected there). ``resolve_address`` is
    accepted for Dask's code and changes nothing.
    """
    del resolve_address
    if in_task():
        return worker_client_of(get_worker(), timeout)
    current = dask_default.current()
    if not isinstance(current, Client):  # None: every default client is a Client
        current = None
    if address is None or (current is not None and current.scheduler_address == address):
        return default_client(current)
    return Client(address, timeout=30.0 if timeout is None else timeout)


@contextmanager
def worker_client(
    timeout: Duration | None = None, separate_thread: bool = True, keep_resources: bool = False
) -> Iterator[Client]:
    """Within this block, the task is a client of its cluster, as Dask's ``worker_client``.

    ``separate_thread`` (the default) secedes for the block and rejoins after it, so
    the task waits without holding a thread, nor its resources unless
    ``keep_resources``. ``RuntimeError`` outside a task.
    """
    worker = get_worker()
    client = worker_client_of(worker, timeout)
    was_seceded = seceded()
    if separate_thread and not was_seceded:
        secede(keep_resources)
    try:
        yield client
    finally:
        if separate_thread and not was_seceded:
            rejoin()


#: Dask's older name for ``worker_client``.
local_client = worker_client


actors.calls_from_tasks_through(lambda: worker_client_of(get_worker()))


_embedded_lock = threading.Lock()
#: The client ``current_or_embedded`` started, kept for later calls (it closes at
#: exit, as every client does).
_embedded: Client | None = None


def current_or_embedded(who: str) -> Client:
    """The current client (the worker's, inside a task), else the client of an
    embedded local cluster (``Client()``), started once for all of ``who``'s calls
    that find no client open (joblib's backend, ``Pool``), under a lock so that two
    threads never start two clusters."""
    global _embedded
    try:
        return get_client()
    except ValueError:  # no client open
        pass
    with _embedded_lock:
        if _embedded is None or _embedded._closed:
            logging.getLogger("apportion.client").info(
                "no apportion client is open: starting a local cluster for %s", who
            )
            _embedded = Client()
        return _embedded
