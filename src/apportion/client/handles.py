"""What Dask scripts read off a client besides its calls: the scheduler it talks to
(``client.scheduler.address``), the event loop its connection runs on
(``client.loop``, passed on as ``loop=``), and its futures by key
(``client.futures``). Functions of the client, which makes them its properties."""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from apportion.client.future import KeyState
from apportion.client.link import ClientLink
from apportion.net.address import RemoteScheduler


class Handled(Protocol):
    """What these read of a client (a ``Client``)."""

    @property
    def _link(self) -> ClientLink: ...

    @property
    def _lock(self) -> threading.RLock: ...

    @property
    def _waiting(self) -> dict[str, KeyState]: ...


def scheduler(client: Handled) -> RemoteScheduler:
    """The scheduler this client talks to; ``.address`` is its address (as Dask's
    ``client.scheduler.address``; "" for a cluster not started yet)."""
    return RemoteScheduler(client._link.address)


def loop(client: Handled) -> asyncio.AbstractEventLoop | None:
    """The asyncio event loop this client's connection runs on, on a thread of its
    own, for a blocking client and an asynchronous one alike (None until an
    asynchronous one is awaited). Dask scripts pass it on, ``progress(x,
    loop=client.loop)`` or ``Client(..., loop=client.loop)``, and both take it; a
    coroutine may be run there with ``asyncio.run_coroutine_threadsafe``."""
    session = client._link.session
    return None if session is None else session.loop.loop


def futures(client: Handled) -> dict[str, KeyState]:
    """This client's live futures by key, as Dask's ``client.futures``: each key's
    state (``status``, ``exception``, ``traceback``, ``done()``), shared by every
    future of the key. A copy, taken now: futures made or dropped later change the
    next one."""
    with client._lock:
        return dict(client._waiting)
