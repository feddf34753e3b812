"""The dashboard's request-head parser: bytes in, a request or a typed refusal out."""

from __future__ import annotations

import pytest

from apportion.dashboard.http import (
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    BadRequest,
    HeadersTooLarge,
    HeadParser,
    HttpError,
    MethodNotAllowed,
    RequestLineTooLong,
    VersionNotSupported,
    parse_head,
    response_head,
    static_name,
)


def test_a_request_arrives_in_pieces() -> None:
    parser = HeadParser()
    data = b"GET /api/status?stream_since=5&x=%20y&x=2 HTTP/1.1\r\nHost: h:1\r\nCookie: a=1\r\n"
    assert parser.feed(data[:7]) is None
    assert parser.feed(data[7:]) is None
    request = parser.feed(b"cookie: b=2\r\n\r\nbody ignored")
    assert request is not None
    assert (request.method, request.path) == ("GET", "/api/status")
    assert request.query == {"stream_since": "5", "x": " y"}
    assert request.headers["host"] == "h:1"
    assert request.cookies() == {"a": "1", "b": "2"}


def test_http_1_0_needs_no_host() -> None:
    request = parse_head(b"HEAD / HTTP/1.0\r\n\r\n")
    assert request.method == "HEAD" and request.version == (1, 0)


@pytest.mark.parametrize(
    ("head", "error"),
    [
        (b"POST / HTTP/1.1\r\nHost: h\r\n\r\n", MethodNotAllowed),
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", VersionNotSupported),
        (b"GET / HTTP/1.1\r\n\r\n", BadRequest),  # no Host
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", BadRequest),
        (b"GET http://x/ HTTP/1.1\r\nHost: h\r\n\r\n", BadRequest),
        (b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.1\r\nHost : h\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.1\r\nHost: h\x01\r\n\r\n", BadRequest),
        (b"\x16\x03\x01\x02\x00\r\n\r\n", BadRequest),  # a TLS hello on a plain port
        (b"\r\n\r\n", BadRequest),
        (b"GET /?a=%ff HTTP/1.1\r\nHost: h\r\n\r\n", BadRequest),
    ],
)
def test_malformed_heads_are_refused(head: bytes, error: type[HttpError]) -> None:
    with pytest.raises(error):
        HeadParser().feed(head)


@pytest.mark.parametrize(
    "start",
    [
        b"\x00\x00\x00\x00\x00\x00\x00\x1c",  # an apportion client's hello frame
        b"\x16\x03\x01",  # a TLS hello
    ],
)
def test_bytes_that_cannot_start_a_request_are_refused_before_a_line_ends(start: bytes) -> None:
    """Not after the head's timeout: the peer (a client sent here by mistake) is told at
    once, and can say what answered."""
    with pytest.raises(BadRequest, match="not an HTTP request"):
        HeadParser().feed(start)


@pytest.mark.parametrize("start", [b"G", b"GET", b"GET ", b"GET /x", b"\r"])
def test_the_start_of_a_request_waits_for_more(start: bytes) -> None:
    assert HeadParser().feed(start) is None


def test_limits_are_kept_before_the_head_is_whole() -> None:
    with pytest.raises(RequestLineTooLong) as line:
        HeadParser().feed(b"GET /" + b"a" * MAX_REQUEST_LINE)
    assert line.value.status == 414
    parser = HeadParser()
    parser.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(HeadersTooLarge) as big:
        for _ in range(100):
            parser.feed(b"X-A: " + b"b" * 1000 + b"\r\n")
    assert big.value.status == 431
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1))
    with pytest.raises(HeadersTooLarge):
        parse_head(b"GET / HTTP/1.1\r\nHost: h\r\n" + many + b"\r\n")


@pytest.mark.parametrize(
    "path",
    [
        "/static/../secret",
        "/static/..",
        "/static/%2e%2e/x",
        "/static/%2E%2E%2Fsecret",
        "/static/a%2fb",
        "/static/..%5csecret",
        "/static/.hidden",
        "/static/",
        "/static/%00",
        "/static/a%ffb",
    ],
)
def test_static_names_are_plain_file_names(path: str) -> None:
    assert static_name(path, "/static/") is None


def test_a_plain_static_name_is_decoded() -> None:
    assert static_name("/static/dashboard.js", "/static/") == "dashboard.js"
    assert static_name("/static/dash%2Dboard.css", "/static/") == "dash-board.css"


def test_response_heads_never_carry_a_line_break_in_a_value() -> None:
    assert response_head(404, [("A", "b")]) == b"HTTP/1.1 404 Not Found\r\nA: b\r\n\r\n"
    with pytest.raises(ValueError):
        response_head(200, [("Location", "/\r\nSet-Cookie: x=1")])
