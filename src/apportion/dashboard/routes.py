"""What the dashboard answers to each request: the login, the page and its files, the
event stream and the JSON routes for tools. See ``docs/dashboard.md``.

Every answer carries ``Server: apportion`` first (a client that reaches this port by
mistake names the dashboard in its error: ``net/foreign_peer.py``) and
``SECURITY_HEADERS``; every route but ``/login`` needs the
session cookie, and every request a ``Host`` naming this dashboard (``origin``).
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from apportion.dashboard.auth import (
    HOW_TO_LOG_IN,
    SESSION_BYTES,
    LoginRefused,
    Logins,
    Sessions,
    metrics_allowed,
)
from apportion.dashboard.events import (
    DEFAULT_INTERVAL,
    RunsCache,
    SchedulerReadout,
    clamp_interval,
    stream_status,
    to_json,
)
from apportion.dashboard.http import BadRequest, Request, response_head, static_name
from apportion.dashboard.metrics import CONTENT_TYPE, MetricsInput, render_metrics
from apportion.dashboard.origin import Origin
from apportion.net.foreign_peer import DASHBOARD_SERVER
from apportion.versions import package_version

#: First of every answer's headers, so that it is within the bytes a client quotes.
SERVER_HEADER = ("Server", DASHBOARD_SERVER)
#: Headers on every answer: nothing cached, no sniffing, no framing, no inline script.
SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'",
    ),
)

#: The files of ``static/`` served, by suffix.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
HTML = "text/html; charset=utf-8"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"

#: Bytes of a run's log sent by default, and at most.
DEFAULT_TAIL = 65536
MAX_TAIL = 1 << 20

_RUN_LOG = re.compile(r"^/api/runs/([0-9]{1,18})/log$")

#: apportion's version, a label of ``apportion_scheduler_info``.
VERSION = package_version("apportion") or "unknown"
#: A sequence number past any the task stream and the warnings reach: /metrics
#: wants neither in its status.
_PAST_ALL = 2**62
#: What /metrics says to a scraper without the token.
HOW_TO_SCRAPE = (
    "/metrics needs Authorization: Bearer <token>, where the token is what "
    "apportion token --metrics prints (see docs/metrics.md)"
)


def write_answer(
    writer: asyncio.StreamWriter,
    status: int,
    content_type: str,
    body: bytes,
    *,
    head_only: bool = False,
    extra: Iterable[tuple[str, str]] = (),
) -> None:
    """Write a whole answer, closing the connection after it."""
    headers = [
        SERVER_HEADER,
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        *SECURITY_HEADERS,
        *extra,
    ]
    writer.write(response_head(status, headers) + (b"" if head_only else body))


def _page(title: str, text: str, link: tuple[str, str] | None = None) -> bytes:
    """A short HTML page of one paragraph (no script: the CSP allows none inline),
    and a link (``(href, text)``) under it if given."""
    under = (
        ""
        if link is None
        else f'<p><a href="{html.escape(link[0])}">{html.escape(link[1])}</a></p>'
    )
    return (
        f'<!doctype html><html lang="en"><meta charset="utf-8"><title>{html.escape(title)}'
        f"</title><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>{under}</html>\n"
    ).encode()


class Routes:
    """The dashboard's answers, for one server (its sessions live here, in memory)."""

    def __init__(
        self,
        origin: Origin,
        key: bytes,
        readout: SchedulerReadout,
        runs: RunsCache,
        static_dir: Path,
        closing: asyncio.Event,
        *,
        clock: Callable[[], float],
        random_bytes: Callable[[int], bytes],
        machine_names: frozenset[str] = frozenset(),
    ) -> None:
        self.origin = origin
        self.readout = readout
        self.runs = runs
        self.static_dir = static_dir
        self.closing = closing
        self.logins = Logins(key)
        self._key = key
        self.sessions = Sessions()
        self._clock = clock
        self._random = random_bytes
        self._machine_names = machine_names
        #: Cookies are shared by every port of a host: the port in the name keeps two
        #: dashboards on one machine from logging each other out.
        self.cookie_name = f"apportion-dashboard-{origin.port}"

    async def serve(self, request: Request, writer: asyncio.StreamWriter) -> int:
        """Answer ``request`` on ``writer``; the status answered."""
        head = request.method == "HEAD"
        host = request.headers.get("host", "")
        if not self.origin.host_allowed(host, self._machine_names):
            write_answer(
                writer,
                421,
                TEXT,
                f"this dashboard is served at {self.origin.url}, not under {host!r}\n".encode(),
                head_only=head,
            )
            return 421
        if request.path == "/login":
            return self._login(request, writer)
        if request.path == "/metrics":  # before the session check: scrapers have none
            return await self._metrics(request, writer, head)
        if not self.sessions.valid(request.cookies().get(self.cookie_name)):
            return self._unauthorized(request, writer)
        return await self._route(request, writer, head)

    async def _route(self, request: Request, writer: asyncio.StreamWriter, head: bool) -> int:
        path = request.path
        if path == "/":
            return await self._static(writer, "index.html", head)
        if path.startswith("/static/"):
            name = static_name(path, "/static/")
            if name is None:
                return _not_found(writer, head)
            return await self._static(writer, name, head)
        if path == "/events":
            return await self._events(request, writer, head)
        if path == "/api/status":
            return await self._status(request, writer, head)
        if path == "/api/story":
            return self._story(request, writer, head)
        found = _RUN_LOG.match(path)
        if found is not None:
            return await self._run_log(int(found[1]), request, writer, head)
        return _not_found(writer, head)

    # --- login ------------------------------------------------------------------------

    def _login(self, request: Request, writer: asyncio.StreamWriter) -> int:
        try:
            self.logins.accept(request.query.get("token", ""), self._clock())
        except LoginRefused as refused:
            why = {"used": "was used already", "expired": "has expired"}.get(
                refused.why, "is not valid"
            )
            text = (
                f"This login link {why}: each link works once, within 24 hours of being "
                f"made. To log in, {HOW_TO_LOG_IN}."
            )
            write_answer(writer, 403, HTML, _page("Login refused", text))
            return 403
        session = self.sessions.open(self._random(SESSION_BYTES))
        cookie = f"{self.cookie_name}={session}; HttpOnly; SameSite=Strict; Path=/"
        if self.origin.tls:
            cookie += "; Secure"
        write_answer(
            writer,
            303,
            TEXT,
            b"logged in; see /\n",
            head_only=request.method == "HEAD",
            extra=[("Location", "/"), ("Set-Cookie", cookie)],
        )
        return 303

    def _unauthorized(self, request: Request, writer: asyncio.StreamWriter) -> int:
        head = request.method == "HEAD"
        what = "You are not logged in to this dashboard (or it restarted since)."
        if request.path.startswith("/api/"):
            body = to_json({"error": "not logged in", "login": HOW_TO_LOG_IN}) + b"\n"
            write_answer(writer, 401, JSON, body, head_only=head)
        elif request.path == "/events":
            write_answer(writer, 401, TEXT, f"{what} To log in, {HOW_TO_LOG_IN}.\n".encode())
        else:
            # A login link opened from another site (a notebook's card, a chat) sets the
            # session, but the browser withholds a SameSite=Strict cookie from the
            # redirect that follows, and Chromium from a reload of it too: only a visit
            # started from this site sends it, such as following the link below.
            text = (
                f"{what} To log in, {HOW_TO_LOG_IN}. If you have just opened a login "
                "link from another web site (a notebook, a chat), follow this link:"
            )
            page = _page("Not logged in", text, ("/", "Open the dashboard"))
            write_answer(writer, 401, HTML, page, head_only=head)
        return 401

    # --- the page ---------------------------------------------------------------------

    async def _static(self, writer: asyncio.StreamWriter, name: str, head: bool) -> int:
        content_type = CONTENT_TYPES.get(Path(name).suffix)
        path = self.static_dir / name
        if content_type is None or not path.is_file():
            return _not_found(writer, head)
        body = await asyncio.to_thread(path.read_bytes)
        write_answer(writer, 200, content_type, body, head_only=head)
        return 200

    async def _events(self, request: Request, writer: asyncio.StreamWriter, head: bool) -> int:
        interval = clamp_interval(_number(request, "interval", DEFAULT_INTERVAL))
        headers = [
            SERVER_HEADER,
            ("Content-Type", "text/event-stream"),
            *SECURITY_HEADERS,
            ("X-Accel-Buffering", "no"),  # a proxy in front must not hold the messages
        ]
        writer.write(response_head(200, headers))
        if not head:
            await stream_status(writer, self.readout, self.runs, interval, self.closing)
        return 200

    # --- for tools --------------------------------------------------------------------

    async def _metrics(self, request: Request, writer: asyncio.StreamWriter, head: bool) -> int:
        """Prometheus's scrape: the metrics bearer token, or a logged-in browser."""
        session = request.cookies().get(self.cookie_name)
        bearer = request.headers.get("authorization")
        if not metrics_allowed(self._key, self.sessions, session, bearer):
            challenge = [("WWW-Authenticate", 'Bearer realm="apportion"')]
            body = f"{HOW_TO_SCRAPE}\n".encode()
            write_answer(writer, 401, TEXT, body, head_only=head, extra=challenge)
            return 401
        overview = await self.runs.get()
        lag, peak = self.readout.loop_lag()
        given = MetricsInput(  # no await from here to the render: one snapshot
            self.readout.status(_PAST_ALL, _PAST_ALL),
            self.readout.durations(),
            VERSION,
            lag,
            peak,
            None if overview is None else overview["counts"],
        )
        text = await asyncio.to_thread(render_metrics, given)
        write_answer(writer, 200, CONTENT_TYPE, text.encode(), head_only=head)
        return 200

    async def _status(self, request: Request, writer: asyncio.StreamWriter, head: bool) -> int:
        overview = await self.runs.get()
        doc = self.readout.status(_count(request, "stream_since"), _count(request, "events_since"))
        doc["runs"] = overview
        body = await asyncio.to_thread(to_json, doc)
        write_answer(writer, 200, JSON, body, head_only=head)
        return 200

    def _story(self, request: Request, writer: asyncio.StreamWriter, head: bool) -> int:
        key = request.query.get("key")
        if key is None:
            raise BadRequest("/api/story needs ?key=")
        story = self.readout.story(key)
        if story is None:
            body = to_json({"error": "no such key", "key": key})
            write_answer(writer, 404, JSON, body, head_only=head)
            return 404
        write_answer(writer, 200, JSON, to_json(story), head_only=head)
        return 200

    async def _run_log(
        self, run_id: int, request: Request, writer: asyncio.StreamWriter, head: bool
    ) -> int:
        source = self.runs.source
        tail = min(MAX_TAIL, _count(request, "tail", DEFAULT_TAIL))
        data = None if source is None else await asyncio.to_thread(source.log_tail, run_id, tail)
        if data is None:
            what = "this scheduler serves no run journal" if source is None else "no such run"
            write_answer(writer, 404, TEXT, f"{what}\n".encode(), head_only=head)
            return 404
        write_answer(writer, 200, TEXT, data, head_only=head)
        return 200


def _not_found(writer: asyncio.StreamWriter, head: bool) -> int:
    write_answer(writer, 404, TEXT, b"not found\n", head_only=head)
    return 404


def _number(request: Request, name: str, default: float) -> float:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadRequest(f"?{name}= must be a number") from None
    if value != value:  # NaN
        raise BadRequest(f"?{name}= must be a number")
    return value


def _count(request: Request, name: str, default: int = 0) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit() or not text.isascii() or len(text) > 18:
        raise BadRequest(f"?{name}= must be a whole number")
    return int(text)
