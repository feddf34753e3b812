"""Byte streams under ``Connection``: read into the caller's buffers, written from them.

Large values must cross without copies: a 1 GiB NumPy array is sent from its own
memory and received into the buffer it will live in. asyncio's streams cannot do
that on Python 3.11 (the transport copies unsent data into its buffer, the reader
copies everything twice), so a ``Stream`` drives the socket itself:

- **Reading.** Small reads (frame headers, message bodies) are served from an
  internal buffer that the socket fills. ``read_into(view)`` first takes what that
  buffer already holds, then has the socket ``recv_into`` the rest of ``view``
  directly. The socket stays registered with the loop while the stream is open; when
  the internal buffer is full and nobody reads, reading pauses, so a peer that
  sends faster than we read is held back by TCP instead of by our memory.
- **Writing.** ``write(buffers)`` keeps references to the caller's buffers, never
  copies: what the socket takes at once goes with ``sendmsg`` (several buffers in one
  call), the rest waits in a queue of memoryviews sent as the socket drains. The
  caller must not change a buffer it handed over until ``drain`` says it is sent.

Two bounds protect a process from peers that misbehave; both are off unless set:

- ``max_unsent``: a peer that never reads would make the queue of unsent bytes grow
  for ever. A write finding more than this many bytes still queued aborts the stream.
  The bytes queued *before* the write are what count, so one large write (a result
  written after ``drain``) is always taken.
- ``stall_timeout``: a read waiting for bytes fails with ``StreamStalled`` after that
  many seconds without a byte arriving. ``readable`` waits without it, so a peer may
  stay idle between frames for as long as it likes, but not in the middle of one.
  The timer is armed only when a read actually has to wait, and re-armed from the
  time of the last arrival rather than restarted on every byte.

``MemoryStream`` pairs (the in-memory transport) share the reading half and copy on
delivery, as a socket would: the receiver never sees the sender's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

logger = logging.getLogger("apportion.net")

#: Anything with the buffer protocol, one byte per item (``bytes``, ``bytearray``,
#: a ``memoryview`` cast to bytes, ``PickleBuffer.raw()``).
Buffer = bytes | bytearray | memoryview

#: Size of the internal read buffer: frame headers and bodies up to half of it are
#: read through it; anything larger is received straight into a buffer of its own.
READ_BUFFER = 256 * 1024
#: ``drain`` returns once no more than this many bytes wait to be sent.
LOW_WATER = 256 * 1024
#: Buffers given to one ``sendmsg`` at most (Linux's IOV_MAX is 1024).
MAX_IOVECS = 512
#: Readable events handled in one callback before yielding to the loop, so a fast
#: sender cannot starve other connections.
MAX_READS_PER_EVENT = 16
#: Seconds ``close`` waits for queued data to leave before dropping it.
CLOSE_FLUSH_TIMEOUT = 10.0
#: A ``max_unsent`` for services: a peer that has left this much unread is not
#: reading, and is dropped before it costs the process its memory.
MAX_UNSENT = 256 * 1024 * 1024
#: A ``stall_timeout`` for services: long enough for a congested network, short
#: enough that a peer cannot hold a connection half-way through a frame for ever.
STALL_TIMEOUT = 120.0


class StreamClosed(ConnectionError):
    """The peer closed the stream (or it failed) before a read was complete.

    ``partial`` holds the bytes of the incomplete read, so that a handshake can quote
    what a foreign peer said before hanging up.
    """

    def __init__(self, message: str, partial: bytes = b"") -> None:
        super().__init__(message)
        self.partial = partial


class StreamStalled(TimeoutError):
    """No byte arrived for ``stall_timeout`` seconds while a read was waiting for some.

    The stream stays open but its reader lost its place: the owner should abort it.
    """

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        #: The ``stall_timeout`` that ran out.
        self.seconds = seconds


def byte_view(buffer: Buffer) -> memoryview:
    """``buffer`` as a flat view of bytes (no copy; it must be contiguous)."""
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class Stream:
    """The reading half every stream shares, and the interface ``Connection`` uses.

    Subclasses fill the internal buffer or a pending ``read_into`` target (``_got``),
    and say when the peer is gone (``_lost``); they implement ``write``, ``drain``,
    ``close`` and ``abort``. One stream belongs to one event loop; only one read may
    be in progress at a time (``Connection.recv`` is the only reader).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, peer: str) -> None:
        self._loop = loop
        #: ``host:port`` of the other end, or the in-memory peer's name.
        self.peer = peer
        self._buf = bytearray(READ_BUFFER)
        #: Unread bytes are ``_buf[_start:_end]``.
        self._start = 0
        self._end = 0
        #: The part of a ``read_into`` buffer still to fill, while one is in progress.
        self._target: memoryview | None = None
        self._waiter: asyncio.Future[None] | None = None
        #: Why no more bytes will come (None while they may).
        self._ended: str | None = None
        self._closed = False
        #: Bytes that may already be queued unsent when ``write`` is called; past it the
        #: peer is taken to read nothing and the stream is aborted (None: no bound).
        #: Only streams that queue apply it (``SocketStream``).
        self.max_unsent: int | None = None
        #: Seconds a read may wait without a byte arriving before ``StreamStalled``
        #: (None: for ever). Not applied by ``readable``.
        self.stall_timeout: float | None = None
        #: Armed only while a read waits under ``stall_timeout``.
        self._stall_timer: asyncio.TimerHandle | None = None
        #: Loop time of the last bytes received; kept only while ``_stall_timer`` is armed.
        self._last_arrival = 0.0

    @property
    def closed(self) -> bool:
        """True once ``close`` or ``abort`` was called or the peer went away."""
        return self._closed

    # --- reading --------------------------------------------------------------------

    async def read_exactly(self, n: int) -> bytes | bytearray:
        """The next ``n`` bytes; ``StreamClosed`` if the stream ends first."""
        if self._end - self._start >= n:
            return self._take(n)
        if n > READ_BUFFER // 2:
            out = bytearray(n)
            await self.read_into(memoryview(out))
            return out
        while self._end - self._start < n:
            if self._ended is not None:
                raise StreamClosed(self._ended, bytes(self._buf[self._start : self._end]))
            self._make_room(n)
            await self._wait()
        return self._take(n)

    async def read_into(self, view: memoryview) -> None:
        """Fill ``view`` (bytes, writable) with the next ``len(view)`` bytes; no copy for
        what had not arrived yet. ``StreamClosed`` if the stream ends first."""
        have = min(len(view), self._end - self._start)
        if have:
            with memoryview(self._buf) as whole:
                view[:have] = whole[self._start : self._start + have]
            self._consumed(have)
        rest = view[have:]
        if not rest:
            return
        self._target = rest
        self._resume_reading()
        try:
            while self._target is not None:
                if self._ended is not None:
                    filled = len(view) - len(self._target)
                    raise StreamClosed(self._ended, bytes(view[: min(filled, 64)]))
                await self._wait()
        finally:
            self._target = None

    async def readable(self) -> None:
        """Wait until an unread byte is here or the stream has ended, for as long as that
        takes: how a reader idles between frames (``stall_timeout`` does not apply)."""
        while self._start == self._end and self._ended is None:
            self._make_room(1)
            await self._wait(idle=True)

    async def read_some(self, n: int) -> bytes:
        """Up to ``n`` bytes, as soon as any are there; b"" at the end of the stream."""
        if self._start == self._end and self._ended is None:
            self._make_room(1)
            await self._wait()
        return self._take(min(n, self._end - self._start))

    def take_now(self, n: int) -> bytes | None:
        """The next ``n`` bytes if they are all here already, else None (nothing taken):
        a frame that arrived whole is read without waiting on anything."""
        if self._end - self._start >= n:
            return self._take(n)
        return None

    def _take(self, n: int) -> bytes:
        with memoryview(self._buf) as whole:
            data = bytes(whole[self._start : self._start + n])
        self._consumed(n)
        return data

    def _consumed(self, n: int) -> None:
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        self._resume_reading()

    def _make_room(self, n: int) -> None:
        """Room after ``_end`` for ``n`` unread bytes in all: move unread bytes to the front,
        and grow the buffer if ``n`` needs it."""
        if self._start and len(self._buf) - self._start < n:
            unread = self._end - self._start
            with memoryview(self._buf) as whole:
                whole[:unread] = whole[self._start : self._end]
            self._start, self._end = 0, unread
        if len(self._buf) < n:
            self._buf.extend(bytes(n - len(self._buf)))
        self._resume_reading()

    def _free_space(self) -> memoryview:
        """Where the next received bytes go when no ``read_into`` is waiting."""
        if self._start and self._end == len(self._buf):
            self._make_room(self._end - self._start + 1)
        return memoryview(self._buf)[self._end :]

    async def _wait(self, *, idle: bool = False) -> None:
        """Wait for ``_wake``: bytes arrived, or the end. Unless ``idle``, a
        ``stall_timeout`` bounds the silence (``StreamStalled``)."""
        self._waiter = waiter = self._loop.create_future()
        timeout = None if idle else self.stall_timeout
        if timeout is not None:
            self._last_arrival = self._loop.time()
            self._stall_timer = self._loop.call_later(timeout, self._check_stall, timeout)
        try:
            await waiter
        finally:
            self._waiter = None
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None

    def _check_stall(self, timeout: float) -> None:
        """The stall timer fired: fail the waiting read if nothing arrived for
        ``timeout`` seconds, or wait out the rest of the silence allowed."""
        self._stall_timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        silent = self._loop.time() - self._last_arrival
        if silent < timeout:  # bytes went into a ``read_into`` target meanwhile
            self._stall_timer = self._loop.call_later(timeout - silent, self._check_stall, timeout)
            return
        waiter.set_exception(
            StreamStalled(
                f"{self.peer} sent nothing for {timeout:g} s while a read waited", timeout
            )
        )

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _got(self, n: int) -> None:
        """``n`` bytes landed in the target, or after ``_end`` when there is none."""
        target = self._target
        if target is not None:
            if self._stall_timer is not None:  # the read goes on waiting: note progress
                self._last_arrival = self._loop.time()
            self._target = target[n:] if n < len(target) else None
            if self._target is None:
                self._wake()
        else:
            self._end += n
            self._wake()

    def _receive_buffer(self) -> memoryview:
        """Where the next bytes should land: the pending target, or free internal space."""
        return self._target if self._target is not None else self._free_space()

    def _lost(self, why: str) -> None:
        """No more bytes will come: wake the reader, who raises once the buffer is read."""
        if self._ended is None:
            self._ended = why
        self._closed = True
        self._wake()

    def _resume_reading(self) -> None:
        """Called when the reader made room; streams that pause reading resume here."""

    # --- writing: each kind of stream ----------------------------------------------------

    def write(self, buffers: Sequence[Buffer]) -> None:
        """Send ``buffers`` in order, after everything written before; never blocks."""
        raise NotImplementedError

    def queued(self) -> int:
        """Bytes written and not yet sent."""
        raise NotImplementedError

    async def drain(self) -> None:
        """Wait until no more than ``LOW_WATER`` bytes wait to be sent."""
        raise NotImplementedError

    async def close(self) -> None:
        """Send what is queued (bounded wait), then close; safe to call twice."""
        raise NotImplementedError

    def abort(self) -> None:
        """Close at once, dropping anything unsent."""
        raise NotImplementedError


class SocketStream(Stream):
    """A connected, non-blocking TCP socket driven by the loop's reader and writer
    callbacks (see the module docstring)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # not TCP (a Unix socket in a test): no Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            host, port = sock.getpeername()[:2]
            peer = f"{host}:{port}"
        except (OSError, ValueError):
            peer = "unknown peer"
        super().__init__(loop, peer)
        self._sock = sock
        self._fd = sock.fileno()
        self._out: deque[memoryview] = deque()
        self._out_size = 0
        self._drained: asyncio.Future[None] | None = None
        self._reading = True
        loop.add_reader(self._fd, self._on_readable)

    # --- reading --------------------------------------------------------------------

    def _on_readable(self) -> None:
        for _ in range(MAX_READS_PER_EVENT):
            view = self._receive_buffer()
            if not view:  # the buffer is full and nobody reads: let TCP hold the peer
                self._pause_reading()
                return
            try:
                n = self._sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._shut(f"connection to {self.peer} failed: {exc.strerror or exc}")
                return
            if n == 0:
                self._shut(f"connection to {self.peer} closed")
                return
            self._got(n)
            if n < len(view):  # the socket is empty for now
                return

    def _pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def _resume_reading(self) -> None:
        if not self._reading and not self._closed:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    # --- writing --------------------------------------------------------------------

    def write(self, buffers: Sequence[Buffer]) -> None:
        if self._closed:
            return
        limit = self.max_unsent
        if limit is not None and self._out_size > limit:
            self._refuse_unread(limit)
            return
        if not self._out and len(buffers) == 1 and type(buffers[0]) is bytes:
            # Most frames: one small bytes object, taken by the socket at once.
            try:
                sent = self._sock.send(buffers[0])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._shut(f"connection to {self.peer} failed: {exc.strerror or exc}")
                return
            if sent == len(buffers[0]):
                return
            buffers = [memoryview(buffers[0])[sent:]]
        views = [byte_view(b) for b in buffers if len(b)]
        if not views:
            return
        was_empty = not self._out
        self._out.extend(views)
        self._out_size += sum(map(len, views))
        if was_empty:
            self._send()
            if self._out and not self._closed:
                self._loop.add_writer(self._fd, self._on_writable)

    def queued(self) -> int:
        return self._out_size

    def _refuse_unread(self, limit: int) -> None:
        """The peer left more than ``limit`` bytes unread: drop it, and say so once
        (the stream is closed after this, so no later write comes here)."""
        why = (
            f"{self.peer} reads nothing: {self._out_size} bytes wait to be sent "
            f"(limit {limit}); closing"
        )
        logger.warning("%s", why)
        self._shut(why)

    def _send(self) -> None:
        """Send from the queue until the socket takes no more or the queue is empty."""
        out = self._out
        while out:
            try:
                sent = self._sock.sendmsg(
                    list(out) if len(out) <= MAX_IOVECS else [out[i] for i in range(MAX_IOVECS)]
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._shut(f"connection to {self.peer} failed: {exc.strerror or exc}")
                return
            self._out_size -= sent
            while sent:
                first = out[0]
                if len(first) <= sent:
                    sent -= len(first)
                    out.popleft()
                else:
                    out[0] = first[sent:]
                    sent = 0
        self._settle_drain()

    def _on_writable(self) -> None:
        self._send()
        if not self._out and not self._closed:
            self._loop.remove_writer(self._fd)

    def _settle_drain(self) -> None:
        drained = self._drained
        if (
            drained is not None
            and not drained.done()
            and (self._out_size <= LOW_WATER or self._closed)
        ):
            drained.set_result(None)

    async def drain(self) -> None:
        while self._out_size > LOW_WATER and not self._closed:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None
        if self._closed and self._ended is not None:
            raise StreamClosed(self._ended)

    async def close(self) -> None:
        if self._closed:
            return
        if self._out:
            deadline = self._loop.time() + CLOSE_FLUSH_TIMEOUT
            while self._out and not self._closed and self._loop.time() < deadline:
                self._drained = self._loop.create_future()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drained, deadline - self._loop.time())
                self._drained = None
        self._shut("closed by this side")

    def abort(self) -> None:
        self._shut("closed by this side")

    def _shut(self, why: str) -> None:
        if self._sock.fileno() == -1:
            self._lost(why)
            return
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False
        self._loop.remove_writer(self._fd)
        self._out.clear()
        self._out_size = 0
        self._sock.close()
        self._lost(why)
        self._settle_drain()


def _numeric(host: str, port: int) -> list[Any]:
    """``getaddrinfo``'s answer for an IP address, worked out here: asking the loop
    would cost a trip through its thread pool on every connection."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return []
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    where = (host, port) if ip.version == 4 else (host, port, 0, 0)
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", where)]


async def connect_tcp(host: str, port: int) -> SocketStream:
    """A stream connected to ``host:port`` (each address ``host`` resolves to, in turn)."""
    loop = asyncio.get_running_loop()
    infos = _numeric(host, port) or await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return SocketStream(sock, loop)
    raise error if error is not None else OSError(f"{host} resolves to no address")


#: What a listener calls for each accepted connection, on the listener's event loop.
class Listener(Protocol):
    """A listening endpoint; ``close`` stops accepting (open connections stay)."""

    #: Where peers connect, with its scheme: ``tcp://host:port``, ``inproc://name``.
    address: str

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


OnConnect = Callable[[Stream], Coroutine[Any, Any, None]]


class SocketListener:
    """A listening socket; each accepted connection is handled by ``_handle(sock)`` in a
    task of its own. ``close`` stops accepting; open connections stay."""

    def __init__(self, sock: socket.socket, address: str, on_connect: OnConnect) -> None:
        self.address = address
        self._sock = sock
        self._on_connect = on_connect
        self._loop = asyncio.get_running_loop()
        self._handlers: set[asyncio.Task[None]] = set()
        self._accepting = self._loop.create_task(self._accept(), name=f"accept-{address}")

    async def _accept(self) -> None:
        while True:
            try:
                conn, _ = await self._loop.sock_accept(self._sock)
            except OSError as exc:
                if self._sock.fileno() == -1:
                    return
                # Out of file descriptors, or a connection reset while queued: the
                # listener itself is fine, so wait a moment and go on accepting.
                logger.warning("listener %s: accept failed: %s", self.address, exc)
                await asyncio.sleep(0.1)
                continue
            task = self._loop.create_task(self._handle(conn))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
            # Let the handler run before the next accept: ``sock_accept`` does not yield
            # while connections are queued, and each one holds a read buffer until its
            # handler's gate drops it, so a burst of connections would otherwise cost
            # a buffer each (up to the backlog) instead of the gate's bound.
            await asyncio.sleep(0)

    async def _handle(self, conn: socket.socket) -> None:
        """Make a stream of ``conn`` and ``_serve`` it (each kind of listener its own)."""
        raise NotImplementedError

    async def _serve(self, stream: Stream) -> None:
        try:
            await self._on_connect(stream)
        except Exception:
            logger.exception("listener %s: a connection's handler failed", self.address)
            stream.abort()

    def close(self) -> None:
        self._accepting.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._accepting


class TcpListener(SocketListener):
    """Plain TCP: each connection is a ``SocketStream``."""

    async def _handle(self, conn: socket.socket) -> None:
        try:
            stream = SocketStream(conn, self._loop)
        except OSError:
            conn.close()
            return
        await self._serve(stream)


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port), non-blocking."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    # IPv4 first where a name has both (``localhost``): peers given 127.0.0.1 must reach it.
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
