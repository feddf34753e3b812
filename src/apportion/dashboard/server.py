"""The dashboard's HTTP server: an asyncio shell around ``http`` (parsing), ``auth``
(logins) and ``routes`` (answers), started and closed by its scheduler.

One request per connection, answered and closed (``Connection: close``), except
the event stream, which stays open. A connection gets ``HEAD_TIMEOUT`` seconds to
send its request head; whatever cannot be parsed gets its 4xx answer, one warning
line in the log, and a closed connection, and the server serves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import ssl
import time
from pathlib import Path

from apportion.dashboard.auth import NONCE_BYTES, login_link
from apportion.dashboard.events import RunsCache, RunsSource, SchedulerReadout
from apportion.dashboard.http import HeadParser, HttpError, Request
from apportion.dashboard.link_template import configured_template, format_link
from apportion.dashboard.origin import (
    WILDCARDS,
    Origin,
    bind_address,
    check_exposure,
    uses_tls,
)
from apportion.dashboard.routes import TEXT, Routes, write_answer
from apportion.net.security import Security

logger = logging.getLogger("apportion.scheduler.dashboard")

#: The page's files (index.html, dashboard.js, dashboard.css).
STATIC_DIR = Path(__file__).with_name("static")
#: Seconds a connection has to send its whole request head.
HEAD_TIMEOUT = 10.0
#: After refusing a request: seconds and bytes of what the peer still sends read and
#: dropped, so that the refusal reaches it (``_linger``).
LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 20
#: Connections served at once; more are closed at once.
MAX_CONNECTIONS = 256


class DashboardServer:
    """The dashboard of one scheduler: ``await start()``, then ``url`` and
    ``login_link()``; ``await close()`` ends every connection, event streams included.

    ``address`` is ``"host:port"``, ``":port"`` or ``"port"`` (``origin.bind_address``:
    no host means ``scheduler_host``'s). A port taken already is replaced by a free
    one, with a warning naming both. A non-loopback host serves HTTPS with the
    scheduler's certificate, or plain HTTP if ``allow_plaintext``; with neither,
    ``start`` raises ``PlaintextRefused``. ``runs`` reads the job queue's journal, if
    the scheduler serves one.
    """

    def __init__(
        self,
        address: str,
        readout: SchedulerReadout,
        security: Security,
        *,
        scheduler_host: str = "127.0.0.1",
        allow_plaintext: bool = False,
        runs: RunsSource | None = None,
        static_dir: Path = STATIC_DIR,
    ) -> None:
        self.address = address
        self.readout = readout
        self.security = security
        self.scheduler_host = scheduler_host
        self.allow_plaintext = allow_plaintext
        self.runs = RunsCache(runs)
        self.static_dir = static_dir
        #: Where it is served, once started.
        self.origin: Origin | None = None
        self._routes: Routes | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()

    def check(self) -> tuple[str, int, bool]:
        """(host, port, https) this dashboard would serve on; raises ``AddressError``
        or ``PlaintextRefused`` if it must not start. Call before listening."""
        host, port = bind_address(self.address, self.scheduler_host)
        if host == "localhost":  # one socket, so that port 0 means one port
            host = "127.0.0.1"
        tls = uses_tls(host, self.security.cert_for("scheduler")[0] is not None)
        check_exposure(host, tls=tls, allow_plaintext=self.allow_plaintext)
        return host, port, tls

    async def start(self) -> DashboardServer:
        """Listen; return once requests are answered."""
        host, port, tls = self.check()
        context = self._tls_context() if tls else None
        try:
            server = await self._listen(host, port, context)
        except OSError as exc:
            if port == 0 or exc.errno != errno.EADDRINUSE:
                raise
            server = await self._listen(host, 0, context)
            taken = server.sockets[0].getsockname()[1]
            logger.warning(
                "dashboard port %d is taken; serving the dashboard on port %d instead",
                port,
                taken,
            )
        self._server = server
        bound = server.sockets[0].getsockname()[1]
        public = socket.gethostname() if host in WILDCARDS else host
        self.origin = Origin(host, bound, tls, public)
        # Only a wildcard bind answers to the machine's names; getfqdn may ask the DNS.
        names = frozenset({public, socket.getfqdn()}) if host in WILDCARDS else frozenset()
        self._routes = Routes(
            self.origin,
            self.security.key(),
            self.readout,
            self.runs,
            self.static_dir,
            self._closing,
            clock=time.time,
            random_bytes=os.urandom,
            machine_names=names,
        )
        return self

    async def _listen(self, host: str, port: int, context: ssl.SSLContext | None) -> asyncio.Server:
        return await asyncio.start_server(self._on_connect, host, port, ssl=context)

    def _tls_context(self) -> ssl.SSLContext:
        """The scheduler's certificate, without asking browsers for one of theirs: the
        scheduler's own context may require client certificates (mutual TLS), which
        browsers do not hold; the login is what admits a browser here."""
        from apportion.net.certificates import server_context

        cert, key = self.security.cert_for("scheduler")
        assert cert is not None
        return server_context(
            cert,
            key,
            None,
            ciphers=self.security.tls_ciphers,
            min_version=self.security.tls_min_version,
        )

    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:8787`` (no token: see ``login_link``)."""
        if self.origin is None:
            raise RuntimeError("the dashboard is not started")
        return self.origin.url

    def login_link(self) -> str:
        """A fresh one-time login link, minted with the scheduler's secret."""
        return login_link(self.url, self.security.key(), time.time(), os.urandom(NONCE_BYTES))

    def user_link(self) -> str:
        """The link to give users: Dask's ``distributed.dashboard.link`` template
        where one is set (link_template.py), else a fresh ``login_link``."""
        template = configured_template()
        if template is not None:
            return format_link(template, self.url, os.environ)
        return self.login_link()

    async def close(self) -> None:
        """Stop listening and end every connection; idempotent."""
        self._closing.set()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    # --- connections ----------------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._handlers) >= MAX_CONNECTIONS or self._routes is None:
            writer.transport.abort()
            return
        self._handlers.add(task)
        try:
            await self._serve(reader, writer, self._routes)
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes: Routes
    ) -> None:
        peer = _peer(writer)
        try:
            request = await asyncio.wait_for(_read_head(reader), HEAD_TIMEOUT)
            if request is None:
                return  # connected and left without a word
            await routes.serve(request, writer)
            await writer.drain()
        except HttpError as exc:
            logger.warning("dashboard: refused a request from %s: %s", peer, str(exc))
            with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                write_answer(writer, exc.status, TEXT, f"{exc}\n".encode())
                await writer.drain()
                await asyncio.wait_for(_linger(reader, writer), LINGER_SECONDS)
        except TimeoutError:
            logger.warning("dashboard: %s sent no whole request in %gs", peer, HEAD_TIMEOUT)
        except (ConnectionError, ssl.SSLError):
            pass  # the browser went away (closed a page, reloaded)


async def _read_head(reader: asyncio.StreamReader) -> Request | None:
    """The request head from ``reader``; None if it closes before sending a byte."""
    parser = HeadParser()
    seen = False
    while True:
        data = await reader.read(16384)
        if not data:
            if not seen:
                return None
            raise ConnectionResetError("the connection closed inside a request head")
        seen = True
        request = parser.feed(data)
        if request is not None:
            return request


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read and drop what the peer still sends, after our answer: closing a socket with
    unread bytes makes the kernel reset the connection, which can destroy the answer
    before the peer has read it (RFC 9112 9.6)."""
    if not writer.can_write_eof():
        return
    writer.write_eof()
    left = LINGER_BYTES
    while left > 0 and (data := await reader.read(min(left, 65536))):
        left -= len(data)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
