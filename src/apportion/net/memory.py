"""The in-memory transport: ``inproc://name`` connections within one process.

A connection is two ``MemoryStream`` ends sharing ``Stream``'s reading half, so the
code above (``Connection``, the codec, the handshake) cannot tell it from TCP: frames
are still encoded and decoded, only the socket is gone. The two ends may live on
different event loops in different threads (a synchronous ``Client`` runs its own
loop thread): bytes written on one end are handed to the other end's loop with
``call_soon_threadsafe``, in order, and a close reaches the other end after every
byte written before it. Written bytes are copied on the way, as a socket would: the
receiver never shares the sender's memory.

Nothing is bounded here: the reader buffers whatever arrives, as it can only hold
what this same process wrote. Nothing waits unsent on the writing side either (a
write is handed over at once), so a stream's ``max_unsent`` has nothing to bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from apportion.net.address import INPROC, check_address
from apportion.net.stream import Buffer, Listener, OnConnect, Stream, byte_view


def _call_on(loop: asyncio.AbstractEventLoop, thread: int, fn: Callable[..., Any]) -> None:
    """Run ``fn`` soon on ``loop``, whichever thread asks; nothing if the loop is closed."""
    if threading.get_ident() == thread:
        loop.call_soon(fn)
    else:
        with contextlib.suppress(RuntimeError):  # that loop is closed: its side is gone
            loop.call_soon_threadsafe(fn)


class MemoryStream(Stream):
    """One end of an in-memory connection, living on ``loop`` (run by thread ``thread``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: int, peer: str) -> None:
        super().__init__(loop, peer)
        self._thread = thread
        #: The other end; set once both exist, before either is used.
        self.other: MemoryStream | None = None

    def write(self, buffers: Sequence[Buffer]) -> None:
        other = self.other
        if self._closed or other is None:
            return
        data = b"".join(byte_view(b) for b in buffers)  # a copy: the writer may reuse them
        if data:
            _call_on(other._loop, other._thread, lambda: other._feed(data))

    def _feed(self, data: bytes) -> None:
        """Bytes from the other end, on this end's loop: into the waiting ``read_into``
        first, the rest into the buffer (grown as needed: nothing here is bounded)."""
        if self._closed:
            return
        view = memoryview(data)
        target = self._target
        if target is not None:
            n = min(len(target), len(view))
            target[:n] = view[:n]
            del target
            self._got(n)
            view = view[n:]
        if view:
            self._make_room(self._end - self._start + len(view))
            self._buf[self._end : self._end + len(view)] = view
            self._got(len(view))

    def queued(self) -> int:
        return 0

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        """Close both ends: the other sees the end after everything written before."""
        if self._closed:
            return
        other = self.other
        if other is not None:
            _call_on(other._loop, other._thread, lambda: other._lost("connection closed"))
        self._lost("closed by this side")


class MemoryListener:
    """An ``inproc://name`` endpoint; accepts on the loop that created it."""

    def __init__(self, transport: MemoryTransport, name: str, on_connect: OnConnect) -> None:
        self._transport = transport
        self.name = name
        self.address = INPROC + name
        self._on_connect = on_connect
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._handlers: set[asyncio.Task[None]] = set()

    def accept(self, near: MemoryStream, peername: str) -> None:
        """Make the listener's end of a connection from ``near``; served on its loop."""
        far = MemoryStream(self._loop, self._thread, peername)
        far.other, near.other = near, far
        # Queued before anything ``near`` writes reaches ``far``: served in order.
        _call_on(self._loop, self._thread, lambda: self._serve(far))

    def _serve(self, far: MemoryStream) -> None:
        task = self._loop.create_task(self._on_connect(far))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    def close(self) -> None:
        self._transport.unregister(self)

    async def wait_closed(self) -> None:
        return None


class MemoryTransport:
    """The registry of ``inproc://`` listeners of this process, and connections to them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: name -> its listener, for as long as it listens.
        self._listeners: dict[str, MemoryListener] = {}
        self._ids = itertools.count(1)

    async def connect(self, address: str) -> Stream:
        check_address(address)
        with self._lock:
            listener = self._listeners.get(address[len(INPROC) :])
        if listener is None:
            raise ConnectionRefusedError(f"nothing listens at {address}")
        loop, thread = asyncio.get_running_loop(), threading.get_ident()
        near = MemoryStream(loop, thread, address)
        listener.accept(near, f"{INPROC}connection-{next(self._ids)}")
        return near

    async def listen(self, host: str, port: int, on_connect: OnConnect) -> Listener:
        """Listen at ``host`` = ``inproc://name`` (``inproc://``: a fresh name); ``port``
        is not used."""
        name = host[len(INPROC) :] if host.startswith(INPROC) else ""
        name = name or uuid.uuid4().hex[:12]
        check_address(INPROC + name)
        with self._lock:
            if name in self._listeners:
                raise OSError(f"{INPROC}{name} is already in use")
            listener = self._listeners[name] = MemoryListener(self, name, on_connect)
        return listener

    def unregister(self, listener: MemoryListener) -> None:
        """Stop accepting at ``listener``'s address (open connections stay)."""
        with self._lock:
            if self._listeners.get(listener.name) is listener:
                del self._listeners[listener.name]

    def names(self) -> list[str]:
        """The addresses listening now (for tests checking that all was cleaned up)."""
        with self._lock:
            return [INPROC + name for name in self._listeners]


#: The one registry of this process: any thread's loop may connect to any listener.
MEMORY = MemoryTransport()
