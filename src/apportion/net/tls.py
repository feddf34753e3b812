"""TLS streams: encrypted connections, authenticated both ways under mutual TLS.

A ``TlsStream`` is a ``Stream`` over asyncio's SSL transport, so ``Connection``, the
framing and the handshake run over it unchanged. It is an ``asyncio.BufferedProtocol``:
the SSL layer decrypts straight into the stream's internal buffer or into a waiting
``read_into`` target, as a socket fills them for ``SocketStream``. Writing copies,
since encryption makes new bytes anyway.

Flow control:

- **Reading.** When the internal buffer is full and no ``read_into`` waits, the stream
  pauses the SSL transport's reading. The SSL layer then stops reading the socket once
  it holds 256 KiB, so TCP holds back a peer that sends faster than we read.
- **Writing.** ``write`` queues the caller's buffers without copying them, as
  ``SocketStream`` does, and hands them to the SSL layer ``LOW_WATER`` bytes at a time
  while it holds no more than that. The SSL layer encrypts at once (the copy TLS
  cannot avoid) and passes all it holds to the socket transport beneath it whenever
  that transport is not full. asyncio shows nothing of that transport's buffer; fed
  piece by piece, it never holds more than a few pieces. The rest waits in the queue
  or in the SSL layer, where ``queued`` counts it and ``drain`` waits for it.

A ``TlsListener`` accepts connections itself and runs each TLS handshake in the
connection's own task (``loop.connect_accepted_socket``). It does not use
``loop.create_server(ssl=...)``: that drops a failed handshake silently (asyncio
logs it only in debug mode, because an ``ssl.SSLError`` is an ``OSError``). Run in the
task, the failure is raised where the listener can log it once, on one line that
names the peer.

The contexts these streams use are made in ``net/certificates.py``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

from apportion.net.address import format_address
from apportion.net.certificates import tls_reason
from apportion.net.gate import HandshakeGate
from apportion.net.stream import (
    CLOSE_FLUSH_TIMEOUT,
    LOW_WATER,
    READ_BUFFER,
    Buffer,
    OnConnect,
    SocketListener,
    Stream,
    StreamClosed,
    bind_tcp,
    byte_view,
)

logger = logging.getLogger("apportion.net")

#: Seconds a TLS handshake may take: it also bounds a peer that connects and says nothing.
HANDSHAKE_TIMEOUT = 10.0


def format_tls_address(host: str, port: int) -> str:
    """``tls://host:port``, bracketing IPv6 hosts."""
    return format_address(host, port, "tls")


class TlsStream(Stream, asyncio.BufferedProtocol):
    """A ``Stream`` over an SSL transport, which drives it as its protocol (see the
    module docstring). Made by ``connect_tls`` and ``TlsListener``, and handed out
    once the TLS handshake is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop, "unknown peer")
        #: The SSL transport, from the end of the TLS handshake on.
        self._transport: asyncio.Transport | None = None
        #: The peer's verified certificate as ``ssl`` decodes it, if it sent one.
        self._peer_certificate: dict[str, Any] | None = None
        #: Written buffers not yet handed to the SSL layer (not copied), and their bytes.
        self._out: deque[memoryview] = deque()
        self._out_size = 0
        #: True while the SSL layer holds more than ``LOW_WATER`` unsent bytes.
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        #: True while this side keeps the SSL layer from delivering (the buffer is full).
        self._read_paused = False
        #: Done once the connection is gone (``connection_lost``); ``close`` waits for it.
        self._gone: asyncio.Future[None] = loop.create_future()

    @property
    def peer_certificate(self) -> dict[str, Any] | None:
        """The peer's certificate (subject, issuer, validity), for logs. ``None`` if the
        peer sent none or it was not verified (``ssl`` decodes verified ones only)."""
        return self._peer_certificate

    # --- the protocol: called by the SSL transport ---------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        if peername:
            self.peer = f"{peername[0]}:{peername[1]}"
        self._peer_certificate = transport.get_extra_info("peercert") or None
        # pause_writing above LOW_WATER, resume_writing at LOW_WATER or less: exactly
        # drain's condition. asyncio's default gap between the two marks would not do:
        # resume_writing only follows a pause_writing, so a backlog between the marks
        # would leave drain waiting for a call that never comes.
        self._transport.set_write_buffer_limits(high=LOW_WATER + 1, low=LOW_WATER)

    def get_buffer(self, sizehint: int) -> memoryview:
        view = self._receive_buffer()
        if not view:
            # buffer_updated pauses reading once the buffer is full, so this should not
            # happen; but the SSL layer would take an empty buffer for the end of the
            # stream, so grow the buffer instead (released first: it cannot grow while
            # a view of it exists).
            view.release()
            self._make_room(len(self._buf) + READ_BUFFER)
            view = self._receive_buffer()
        return view

    def buffer_updated(self, nbytes: int) -> None:
        self._got(nbytes)
        if self._target is None and self._start == 0 and self._end == len(self._buf):
            self._pause_reading()

    def eof_received(self) -> bool | None:
        # The peer's close_notify: a clean end, after everything it sent.
        self._lost(f"connection to {self.peer} closed")
        self._settle_drain()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._lost(f"connection to {self.peer} closed")
        else:
            self._lost(f"connection to {self.peer} failed: {tls_reason(exc)}")
        self._settle_drain()
        if not self._gone.done():
            self._gone.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._out:
            # Fed on the next turn, not from inside the SSL layer while it works.
            self._loop.call_soon(self._feed)
        else:
            self._settle_drain()

    # --- reading --------------------------------------------------------------------

    def _pause_reading(self) -> None:
        if not self._read_paused and self._transport is not None and not self._closed:
            self._read_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused and self._transport is not None and not self._closed:
            self._read_paused = False
            self._transport.resume_reading()

    # --- writing --------------------------------------------------------------------

    def write(self, buffers: Sequence[Buffer]) -> None:
        if self._closed or self._transport is None:
            return
        views = [view for view in map(byte_view, buffers) if view.nbytes]
        self._out.extend(views)
        self._out_size += sum(view.nbytes for view in views)
        self._feed()

    def _feed(self) -> None:
        """Hand queued bytes to the SSL layer, up to ``LOW_WATER`` at a time, until it
        holds more than ``LOW_WATER`` (it calls ``pause_writing``) or the queue is empty."""
        out, transport = self._out, self._transport
        while out and not self._write_paused and not self._closed and transport is not None:
            piece: list[memoryview] = []
            size = 0
            while out and size < LOW_WATER:
                view = out[0]
                take = min(view.nbytes, LOW_WATER - size)
                if take == view.nbytes:
                    piece.append(out.popleft())
                else:
                    piece.append(view[:take])
                    out[0] = view[take:]
                size += take
            self._out_size -= size
            transport.writelines(piece)
        self._settle_drain()

    def _backed_up(self) -> bool:
        """Whether ``drain`` must wait: the SSL layer holds more than ``LOW_WATER`` (it
        paused us), or queued bytes are still to be handed to it (between its
        ``resume_writing`` and the next loop turn, the only time a queue waits)."""
        return self._write_paused or bool(self._out)

    def queued(self) -> int:
        # Once the transport is closed asyncio's SSL transport may no longer answer.
        if self._closed or self._transport is None:
            return 0
        return self._out_size + self._transport.get_write_buffer_size()

    def _settle_drain(self) -> None:
        drained = self._drained
        if drained is not None and not drained.done() and (self._closed or not self._backed_up()):
            drained.set_result(None)

    async def _until_drained(self, timeout: float | None) -> None:
        """Wait until no more than ``LOW_WATER`` bytes wait, or the stream ends;
        ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else self._loop.time() + timeout
        while self._backed_up() and not self._closed:
            self._drained = self._loop.create_future()
            try:
                left = None if deadline is None else deadline - self._loop.time()
                await asyncio.wait_for(self._drained, left)
            finally:
                self._drained = None

    async def drain(self) -> None:
        await self._until_drained(None)
        if self._closed and self._ended is not None:
            raise StreamClosed(self._ended)

    async def close(self) -> None:
        """Send what is queued, close the TLS session (close_notify both ways) and
        return once the connection is gone. Past ``CLOSE_FLUSH_TIMEOUT`` in all, or if
        cancelled, abort instead. Safe to call twice, and after ``abort``."""
        transport = self._transport
        if transport is None:
            self._lost("closed by this side")
            return
        start = self._loop.time()
        try:
            # The SSL layer sends what it holds as it closes; the queue goes first.
            await self._until_drained(CLOSE_FLUSH_TIMEOUT)
            if not self._closed:
                self._lost("closed by this side")
                self._settle_drain()
                transport.close()
            left = CLOSE_FLUSH_TIMEOUT - (self._loop.time() - start)
            await asyncio.wait_for(asyncio.shield(self._gone), max(left, 0.0))
        except TimeoutError:
            logger.warning(
                "connection to %s did not close within %gs; aborted", self.peer, CLOSE_FLUSH_TIMEOUT
            )
        finally:
            if not self._gone.done():
                self.abort()

    def abort(self) -> None:
        self._out.clear()
        self._out_size = 0
        self._lost("closed by this side")
        self._settle_drain()
        # Even after the peer's end: the SSL layer may still be closing the session.
        if self._transport is not None and not self._gone.done():
            self._transport.abort()


def _handshake_failed(exc: OSError, peer: str, timeout: float) -> OSError:
    """``exc`` from a TLS handshake with ``peer``, as an error of the same class with
    a one-line message naming the peer and the reason."""
    if isinstance(exc, ConnectionAbortedError):  # asyncio's handshake timeout
        reason = f"no TLS handshake within {timeout:g}s"
    else:
        reason = tls_reason(exc)
    message = f"TLS handshake with {peer} failed: {reason}"
    if isinstance(exc, ssl.SSLError):
        # Its text is its second argument (``strerror``); with one, it would show a tuple.
        return type(exc)(exc.errno, message)
    return type(exc)(message)


async def connect_tls(
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    server_hostname: str | None = None,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
) -> TlsStream:
    """A TLS stream to ``host:port``, its handshake done.

    ``server_hostname`` is the name sent to the server (SNI) and checked against its
    certificate if ``context`` checks names (default: ``host``). A failed TCP connection
    raises as ``connect_tcp`` does. A failed handshake raises an ``OSError`` of the
    same class as the failure (``ssl.SSLError``, ``ssl.SSLCertVerificationError``,
    ...), with one line naming ``host:port`` and the reason.

    Under TLS 1.3 a server that refuses our certificate says so after the client's
    handshake is done: that shows as the stream's end on the first read, not here.
    """
    loop = asyncio.get_running_loop()
    made: list[TlsStream] = []

    def protocol() -> TlsStream:
        # Called once the TCP connection is made: errors after this are the handshake's.
        made.append(TlsStream(loop))
        return made[0]

    try:
        await loop.create_connection(
            protocol,
            host,
            port,
            ssl=context,
            server_hostname=server_hostname,
            ssl_handshake_timeout=handshake_timeout,
            ssl_shutdown_timeout=CLOSE_FLUSH_TIMEOUT,
        )
    except OSError as exc:
        if not made:
            raise
        raise _handshake_failed(exc, f"{host}:{port}", handshake_timeout) from None
    return made[0]


def _peer_of(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except (OSError, ValueError):
        return "unknown peer"
    return f"{host}:{port}"


class TlsListener(SocketListener):
    """A listening socket whose connections speak TLS; each is served by
    ``on_connect(stream)`` in a task of its own, once its handshake is done.

    A peer that fails the handshake (no or a wrong certificate, plain TCP, silence
    past ``handshake_timeout``) is dropped and logged on ``apportion.net``, once per
    host and minute; the listener goes on. As for the secret's handshake
    (``net/door.py``), at most so many TLS handshakes wait per host and in all, the
    oldest giving way to a new one. ``close`` stops accepting; open connections stay.
    """

    def __init__(
        self,
        sock: socket.socket,
        address: str,
        on_connect: OnConnect,
        context: ssl.SSLContext,
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        self._context = context
        self._handshake_timeout = handshake_timeout
        self._gate = HandshakeGate()
        #: Handshakes dropped for newer ones: their cancellation is no shutdown.
        self._dropped: set[asyncio.Task[Any]] = set()
        super().__init__(sock, address, on_connect)

    async def _handle(self, conn: socket.socket) -> None:
        peer = _peer_of(conn)
        host = peer.rpartition(":")[0] or peer
        me = asyncio.current_task()
        assert me is not None
        for dropped in self._gate.admit(me, host, self._loop.time()):
            assert isinstance(dropped, asyncio.Task)
            self._dropped.add(dropped)
            dropped.cancel()  # asyncio closes its half-made transport
        try:
            # On failure asyncio closes the connection; it logs nothing (see the module).
            _, stream = await self._loop.connect_accepted_socket(
                lambda: TlsStream(self._loop),
                conn,
                ssl=self._context,
                ssl_handshake_timeout=self._handshake_timeout,
                ssl_shutdown_timeout=CLOSE_FLUSH_TIMEOUT,
            )
        except OSError as exc:
            self._log_failed_handshake(exc, peer, host)
            return
        except asyncio.CancelledError:
            if me not in self._dropped:
                raise
            self._dropped.discard(me)
            self._log_refusal(host, f"{peer}: dropped for a newer connection from {host}")
            return
        finally:
            self._gate.done(me)
        await self._serve(stream)

    def _log_failed_handshake(self, exc: OSError, peer: str, host: str) -> None:
        error = str(_handshake_failed(exc, peer, self._handshake_timeout))
        if isinstance(exc, ConnectionResetError):
            # Gone before the handshake ended, with no TLS error: port probes and health
            # checks do that all day, so it is no warning.
            logger.info("listener %s: %s", self.address, error)
        else:
            self._log_refusal(host, error)

    def _log_refusal(self, host: str, reason: str) -> None:
        for line in self._gate.refusal_lines(host, reason, self._loop.time()):
            logger.warning("listener %s: %s", self.address, line)


async def listen_tls(
    host: str,
    port: int,
    on_connect: OnConnect,
    context: ssl.SSLContext,
    *,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
) -> TlsListener:
    """Listen for TLS connections on ``host``/``port`` (0: any free port); the listener's
    ``address`` is ``tls://host:port``."""
    sock = bind_tcp(host, port)
    address = format_tls_address(host, sock.getsockname()[1])
    return TlsListener(sock, address, on_connect, context, handshake_timeout=handshake_timeout)
