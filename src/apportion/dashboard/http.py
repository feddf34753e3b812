"""HTTP/1.1 request heads, parsed without I/O (bytes in, a ``Request`` out), and
response heads written the same way. Pure.

Theory of operation
-------------------
The dashboard serves GET and HEAD only, one request per connection (the event
stream excepted), so this is all of HTTP it needs: ``HeadParser.feed`` takes bytes
as they arrive and returns the ``Request`` once the blank line ending the head is
in, or None for more. Anything it cannot accept raises an ``HttpError`` carrying the
status to answer with, before the head is even complete when a limit is passed:

- a request line longer than ``MAX_REQUEST_LINE`` bytes: 414;
- header lines over ``MAX_HEADER_BYTES`` bytes, or more than ``MAX_HEADERS`` of them: 431;
- a method other than GET or HEAD: 405; a version other than HTTP/1.0 or 1.1: 505;
- anything else malformed (bad characters, folded lines, a missing or repeated
  ``Host``, a target not starting with ``/``): 400. Bytes that cannot begin a
  request line at all (an apportion client's binary hello, sent here by mistake)
  get their 400 at once, not after the head's timeout, so that the client can say
  what answered.

The rules are RFC 9112's, kept strict: a server that guesses at malformed input
is one that two parsers (a proxy's and ours) can read differently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote

#: Longest request line accepted (method, target, version).
MAX_REQUEST_LINE = 8 * 1024
#: Most bytes of header lines accepted, and most header lines.
MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 100
#: Most query parameters read from a target.
MAX_QUERY_FIELDS = 50

#: The methods served; HEAD answers as GET would, without the body.
METHODS = frozenset({"GET", "HEAD"})

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
#: The start of a request line: a method so far, or a method and a space.
_METHOD_SO_FAR = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]*( |\r|$)")
_VERSION = re.compile(rb"^HTTP/([0-9])\.([0-9])$")
#: A target in origin form: visible ASCII, starting with a slash.
_TARGET = re.compile(rb"^/[\x21-\x7e]*$")
#: A header value: visible ASCII, spaces, tabs and obs-text; no control characters.
_VALUE = re.compile(rb"^[\t\x20-\x7e\x80-\xff]*$")

REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    414: "URI Too Long",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


class HttpError(Exception):
    """A request that cannot be served; ``status`` is the answer, the message says why."""

    status = 400


class BadRequest(HttpError):
    """Malformed: 400."""


class RequestLineTooLong(HttpError):
    """The request line passes ``MAX_REQUEST_LINE``: 414."""

    status = 414


class HeadersTooLarge(HttpError):
    """Too many header lines, or too many bytes of them: 431."""

    status = 431


class MethodNotAllowed(HttpError):
    """A method other than GET and HEAD: 405."""

    status = 405


class VersionNotSupported(HttpError):
    """Not HTTP/1.0 or HTTP/1.1: 505."""

    status = 505


@dataclass(frozen=True, slots=True)
class Request:
    """One request head, as parsed."""

    method: str
    #: The target as sent (path and query, still percent-encoded).
    target: str
    #: The path part of the target, still percent-encoded.
    path: str
    #: Query parameters, decoded; the first value of each name.
    query: Mapping[str, str]
    #: Header names in lower case; repeated headers joined by ", " (cookies by "; ").
    headers: Mapping[str, str] = field(default_factory=dict)
    #: (major, minor): (1, 1) or (1, 0).
    version: tuple[int, int] = (1, 1)

    def cookies(self) -> dict[str, str]:
        """The ``Cookie`` header's pairs; the first of a repeated name wins."""
        return parse_cookies(self.headers.get("cookie", ""))


class HeadParser:
    """Feed bytes; get the ``Request`` once its head is complete (see the module)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Request | None:
        """Add ``data``; the request once the head is complete, else None.

        Raises ``HttpError`` as soon as the bytes so far cannot become an acceptable
        head. Bytes after the head (a body, a pipelined request) are ignored: the
        connection closes after one answer.
        """
        self._buffer += data
        buffer = self._buffer
        if not _METHOD_SO_FAR.match(buffer):
            raise BadRequest("not an HTTP request")
        line_end = buffer.find(b"\r\n")
        if line_end < 0:
            if len(buffer) > MAX_REQUEST_LINE:
                raise RequestLineTooLong(f"request line over {MAX_REQUEST_LINE} bytes")
            return None
        if line_end > MAX_REQUEST_LINE:
            raise RequestLineTooLong(f"request line over {MAX_REQUEST_LINE} bytes")
        end = buffer.find(b"\r\n\r\n", line_end)
        if end < 0:
            if line_end == 0:
                raise BadRequest("empty request line")
            if len(buffer) - line_end - 2 > MAX_HEADER_BYTES:
                raise HeadersTooLarge(f"header lines over {MAX_HEADER_BYTES} bytes")
            return None
        if end - line_end - 2 > MAX_HEADER_BYTES:
            raise HeadersTooLarge(f"header lines over {MAX_HEADER_BYTES} bytes")
        return parse_head(bytes(buffer[: end + 4]))


def parse_head(head: bytes) -> Request:
    """The request whose whole head (through the blank line) is ``head``."""
    if not head.endswith(b"\r\n\r\n"):
        raise BadRequest("the head does not end with a blank line")
    line, _, rest = head[:-4].partition(b"\r\n")
    method, target, version = _request_line(line)
    headers = _headers(rest.split(b"\r\n") if rest else [])
    if version == (1, 1) and "host" not in headers:
        raise BadRequest("no Host header")
    path, _, query_text = target.partition("?")
    try:
        pairs = parse_qsl(
            query_text, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS, errors="strict"
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"bad query: {exc}") from None
    query: dict[str, str] = {}
    for name, value in pairs:
        query.setdefault(name, value)
    return Request(method, target, path, query, headers, version)


def _request_line(line: bytes) -> tuple[str, str, tuple[int, int]]:
    parts = line.split(b" ")
    if len(parts) != 3:
        raise BadRequest("the request line is not METHOD TARGET VERSION")
    method, target, version = parts
    if not _TOKEN.match(method):
        raise BadRequest("bad method")
    matched = _VERSION.match(version)
    if matched is None:
        raise BadRequest("bad HTTP version")
    numbers = (int(matched[1]), int(matched[2]))
    if numbers not in ((1, 0), (1, 1)):
        raise VersionNotSupported(f"HTTP/{numbers[0]}.{numbers[1]} is not served")
    if method.decode() not in METHODS:
        raise MethodNotAllowed(f"{method.decode()} is not served (GET and HEAD are)")
    if not _TARGET.match(target):
        raise BadRequest("the target must be a path starting with /")
    return method.decode(), target.decode(), numbers


def _headers(lines: list[bytes]) -> dict[str, str]:
    if len(lines) > MAX_HEADERS:
        raise HeadersTooLarge(f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            # Also a line starting with whitespace: obsolete folding, refused (RFC 9112 5.2).
            raise BadRequest("bad header line")
        value = value.strip(b" \t")
        if not _VALUE.match(value):
            raise BadRequest("control characters in a header value")
        key = name.decode().lower()
        text = value.decode("latin-1")
        if key in headers:
            if key == "host":
                raise BadRequest("more than one Host header")
            text = headers[key] + ("; " if key == "cookie" else ", ") + text
        headers[key] = text
    return headers


def parse_cookies(header: str) -> dict[str, str]:
    """``a=1; b=2`` as a dict; pairs without ``=`` are skipped, the first name wins."""
    out: dict[str, str] = {}
    for pair in header.split(";"):
        name, eq, value = pair.strip().partition("=")
        if eq and name:
            out.setdefault(name, value.strip().strip('"'))
    return out


def static_name(path: str, prefix: str) -> str | None:
    """The file name ``path`` asks for under ``prefix`` (``/static/``), decoded; None
    unless it is one plain name: no slash, no backslash, no ``..``, no leading dot,
    whether written plainly or percent-encoded."""
    if not path.startswith(prefix):
        return None
    try:
        name = unquote(path[len(prefix) :], errors="strict")
    except UnicodeDecodeError:
        return None
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", name) or ".." in name:
        return None
    return name


def response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    """``HTTP/1.1 <status>`` and the header lines, through the blank line."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    for name, value in headers:
        if "\r" in value or "\n" in value:  # a header must never end early
            raise ValueError(f"line break in the value of header {name}")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
