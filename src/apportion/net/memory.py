"""The in-memory transport: ``inproc://name`` connections within one process.

A connection is two ``MemoryPipe`` ends, each an ``asyncio.Transport`` under an
ordinary ``StreamReaderProtocol``, so the code above (``Connection``, the codec, the
handshake) cannot tell it from TCP: frames are still encoded and decoded, only the
socket is gone. The two ends may live on different event loops in different threads
(a synchronous ``Client`` runs its own loop thread): bytes written on one end are
handed to the other end's loop with ``call_soon_threadsafe``, in order, and a close
reaches the other end after every byte written before it.

Nothing is bounded here: the reader buffers whatever arrives (``pause_reading`` is
not supported, so ``StreamReader`` stops asking), as it can only hold what this same
process wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apportion.net.address import INPROC, check_address

if TYPE_CHECKING:
    from apportion.net.transport import Listener, OnConnect

#: The same read-buffer limit as ``asyncio.open_connection``'s.
_LIMIT = 2**16


def _call_on(loop: asyncio.AbstractEventLoop, thread: int, fn: Callable[..., Any]) -> None:
    """Run ``fn`` soon on ``loop``, whichever thread asks; nothing if the loop is closed."""
    if threading.get_ident() == thread:
        loop.call_soon(fn)
    else:
        with contextlib.suppress(RuntimeError):  # that loop is closed: its side is gone
            loop.call_soon_threadsafe(fn)


class MemoryPipe(asyncio.Transport):
    """One end of an in-memory connection, living on ``loop`` (run by thread ``thread``)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, thread: int, peername: str, sockname: str
    ) -> None:
        super().__init__({"peername": peername, "sockname": sockname})
        self._loop = loop
        self._thread = thread
        #: Set before any byte is received (received bytes are queued behind its setting).
        self._protocol: asyncio.Protocol | None = None
        #: The other end; set once both exist, before either is used.
        self.peer: MemoryPipe | None = None
        #: True once either end closed: nothing more is written from here.
        self._closing = False
        self._lost = False

    def attach(self, protocol: asyncio.Protocol) -> None:
        """Give this end its protocol (on its own loop) and tell the protocol it is connected."""
        self._protocol = protocol
        protocol.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.peer is None:
            return
        self.peer._deliver(bytes(data))  # a copy: the writer may reuse its buffer

    def _deliver(self, data: bytes) -> None:
        _call_on(self._loop, self._thread, lambda: self._received(data))

    def _received(self, data: bytes) -> None:
        if not self._lost and self._protocol is not None:
            self._protocol.data_received(data)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close both ends: the peer sees end-of-file after everything written before."""
        if self._closing:
            return
        self._closing = True
        peer = self.peer
        if peer is not None:
            _call_on(peer._loop, peer._thread, peer._peer_closed)
        _call_on(self._loop, self._thread, self._connection_lost)

    def abort(self) -> None:
        # Nothing is buffered on this side: aborting is closing.
        self.close()

    def _peer_closed(self) -> None:
        self._closing = True
        self._connection_lost()

    def _connection_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        if self._protocol is not None:
            self._protocol.connection_lost(None)

    def get_write_buffer_size(self) -> int:
        return 0


def _stream_end(pipe: MemoryPipe) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Reader and writer over ``pipe``, on the running loop (``pipe``'s)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_LIMIT, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    pipe.attach(protocol)
    return reader, asyncio.StreamWriter(pipe, protocol, reader, loop)


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

    def accept(self, near: MemoryPipe, peername: str) -> MemoryPipe:
        """The listener's end of a connection from ``near``; served on the listener's loop."""
        far = MemoryPipe(self._loop, self._thread, peername, self.address)
        far.peer, near.peer = near, far
        # Queued before any byte ``near`` writes, so the protocol exists when they land.
        _call_on(self._loop, self._thread, lambda: self._serve(far))
        return far

    def _serve(self, far: MemoryPipe) -> None:
        reader, writer = _stream_end(far)
        task = self._loop.create_task(self._on_connect(reader, writer))
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

    async def connect(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        check_address(address)
        with self._lock:
            listener = self._listeners.get(address[len(INPROC) :])
        if listener is None:
            raise ConnectionRefusedError(f"nothing listens at {address}")
        loop, thread = asyncio.get_running_loop(), threading.get_ident()
        near = MemoryPipe(loop, thread, address, f"{INPROC}connection-{next(self._ids)}")
        listener.accept(near, near.get_extra_info("sockname"))
        return _stream_end(near)

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
