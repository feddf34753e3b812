"""The dashboard over real TCP: login, cookies, the routes, the event stream, and
what the server does with garbage, strangers and a taken port."""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import logging
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from apportion import Client, LocalCluster
from apportion.net.security import PlaintextRefused
from apportion.runs.journal import Journal
from apportion.runs.overview import JournalOverview
from apportion.runs.spec import new_spec
from apportion.scheduler.service import Scheduler

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.tcp


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as client:
        yield client


def port_of(cluster: LocalCluster) -> int:
    dashboard = cluster.scheduler.dashboard
    assert dashboard is not None and dashboard.origin is not None
    return dashboard.origin.port


def raw(port: int, data: bytes) -> bytes:
    """Send ``data``, read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def get(
    port: int, target: str, *, cookie: str = "", host: str = ""
) -> tuple[int, dict[str, str], bytes]:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}"]
    if cookie:
        lines.append(f"Cookie: {cookie}")
    answer = raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return int(status_line.split()[1]), headers, body


def login(cluster: LocalCluster) -> str:
    """A session cookie (``name=value``) from a fresh link."""
    link = cluster.dashboard_link
    assert link is not None
    status, headers, _ = get(port_of(cluster), link.partition(str(port_of(cluster)))[2])
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain HTTP on loopback
    return cookie.partition(";")[0]


def test_a_link_logs_a_browser_in_once(cluster: LocalCluster, client: Client) -> None:
    link = client.dashboard_link
    assert link is not None and link != client.dashboard_link  # a fresh one each time
    base = client.scheduler_info()["dashboard"]
    assert link.startswith(f"{base}/login?token=")
    assert client.cluster_status()["scheduler"]["dashboard"] == base
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with browser.open(link, timeout=10) as page:
        assert page.url == f"{base}/" and b"apportion" in page.read()
        assert page.headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert page.headers["X-Frame-Options"] == "DENY"
    with browser.open(f"{base}/api/status", timeout=10) as answer:
        status = json.loads(answer.read())
    assert [w["name"] for w in status["workers"]] == ["worker-0"]
    assert status["runs"] is None  # no journal served
    with pytest.raises(urllib.error.HTTPError) as again:
        urllib.request.urlopen(link, timeout=10)
    assert again.value.code == 403
    assert b"client.dashboard_link" in again.value.read()


def test_every_route_but_login_needs_the_session(cluster: LocalCluster) -> None:
    port = port_of(cluster)
    for target, kind in [("/", "text/html"), ("/api/status", "application/json")]:
        status, headers, body = get(port, target)
        assert status == 401 and headers["content-type"].startswith(kind)
        assert b"dashboard_link" in body and headers["cache-control"] == "no-store"
        if kind == "text/html":  # a visit begun on this site sends a Strict cookie
            assert b'<a href="/">Open the dashboard</a>' in body
    status, headers, _ = get(port, "/events", cookie="apportion-dashboard-1=forged")
    assert status == 401 and headers["content-type"].startswith("text/plain")
    status, _, body = get(port, "/login?token=forged")
    assert status == 403 and b"not valid" in body


def test_the_page_files_and_nothing_else(cluster: LocalCluster) -> None:
    port, cookie = port_of(cluster), login(cluster)
    status, headers, _ = get(port, "/static/index.html", cookie=cookie)
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    for target in [
        "/static/../server.py",
        "/static/%2e%2e/server.py",
        "/static/..%2Fserver.py",
        "/static/%2E%2E%2F%2E%2E%2Fpyproject.toml",
        "/static//etc/passwd",
        "/static/missing.js",
        "/../server.py",
    ]:
        assert get(port, target, cookie=cookie)[0] == 404, target


def test_stories_and_run_logs(cluster: LocalCluster, client: Client) -> None:
    port, cookie = port_of(cluster), login(cluster)
    future = client.submit(sum, [1, 2], key="story-key")
    assert future.result(timeout=30) == 3
    status, _, body = get(port, "/api/story?key=story-key", cookie=cookie)
    story = json.loads(body)
    assert status == 200 and story["key"] == "story-key"
    assert story["story"][-1][1:4] == ["story-key", "processing", "memory"]
    assert get(port, "/api/story?key=never-seen", cookie=cookie)[0] == 404
    assert get(port, "/api/runs/1/log", cookie=cookie)[0] == 404  # no journal served
    assert get(port, "/api/status?stream_since=x", cookie=cookie)[0] == 400


def read_event(lines: Iterator[bytes]) -> dict[str, Any]:
    fields = []
    for line in lines:
        if line == b"\n":
            break
        fields.append(line)
    assert fields[0] == b"event: status\n"
    result: dict[str, Any] = json.loads(fields[1].removeprefix(b"data: "))
    return result


def test_the_event_stream_sends_only_what_is_new(cluster: LocalCluster, client: Client) -> None:
    assert client.submit(sum, [1], key="before-stream").result(timeout=30) == 1
    port, cookie = port_of(cluster), login(cluster)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"GET /events?interval=0.2 HTTP/1.1\r\nHost: localhost:{port}\r\n"
            f"Cookie: {cookie}\r\n\r\n".encode()
        )
        lines = iter(sock.makefile("rb"))
        assert next(lines) == b"HTTP/1.1 200 OK\r\n"
        while next(lines) != b"\r\n":
            pass
        first = read_event(lines)
        keys = [item[3] for item in first["stream"]["items"]]
        assert "before-stream" in keys and first["runs"] is None
        assert client.submit(sum, [2], key="during-stream").result(timeout=30) == 2
        later = read_event(lines)
        while "during-stream" not in [item[3] for item in later["stream"]["items"]]:
            assert later["stream"]["items"] == []
            later = read_event(lines)
    assert [item[3] for item in later["stream"]["items"]] == ["during-stream"]
    assert later["stream"]["seq"] > first["stream"]["seq"]


def test_garbage_gets_an_answer_and_the_server_serves_on(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    port = port_of(cluster)
    with caplog.at_level(logging.WARNING, "apportion.scheduler.dashboard"):
        assert raw(port, b"\x16\x03\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        huge = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 40_000 + b"\r\n\r\n"
        assert raw(port, huge).startswith(b"HTTP/1.1 431 ")
        assert raw(port, b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405 ")
        assert raw(port, b"") == b""
    assert all(r.exc_info is None for r in caplog.records)
    assert len(caplog.records) == 3
    assert get(port, "/")[0] == 401  # still serving


def test_a_stranger_host_is_refused(cluster: LocalCluster) -> None:
    port, cookie = port_of(cluster), login(cluster)
    assert get(port, "/api/status", cookie=cookie, host=f"rebound.example:{port}")[0] == 421
    assert get(port, "/api/status", cookie=cookie, host=f"localhost:{port}")[0] == 200


def test_a_taken_port_is_replaced_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    async def main(port: int) -> int:
        async with Scheduler(port=0, dashboard_address=f"127.0.0.1:{port}") as scheduler:
            assert scheduler.dashboard is not None and scheduler.dashboard.origin is not None
            return scheduler.dashboard.origin.port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING, "apportion.scheduler.dashboard"):
            served = asyncio.run(main(port))
    assert served != port
    assert f"port {port} is taken" in caplog.text and f"port {served} instead" in caplog.text


def test_a_dashboard_off_loopback_needs_tls_or_consent() -> None:
    scheduler = Scheduler(port=0, dashboard_address="0.0.0.0:0")
    with pytest.raises(PlaintextRefused, match="dashboard"):
        asyncio.run(scheduler.start())
    assert scheduler.address == ""  # refused before listening


def test_the_journal_view(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with Journal(path) as journal:
        resources = "foo=1 memory=50e9"
        spec = new_spec(["echo", "a b"], cwd="/", env={}, resources=resources, name="sweep")
        journal.stage([replace(spec, array_index=i) for i in range(3)], 100.0)
        (lone,) = journal.stage([new_spec(["true"], cwd="/", env={})], 101.0)
        journal.append_log(lone, b"0123456789")
    view = JournalOverview(path)
    overview = view.overview()
    assert overview["counts"]["staged"] == 4
    assert overview["arrays"] == [
        {"id": 1, "name": "sweep", "total": 3, **dict.fromkeys(overview["counts"], 0), "staged": 3}
    ]
    assert [r["label"] for r in overview["recent"]] == ["4", "sweep[2]", "sweep[1]", "sweep[0]"]
    assert overview["recent"][1]["command"] == "echo 'a b'"
    # Amounts as the page shows them everywhere, not 50000000000.
    assert overview["recent"][1]["resources"] == "foo=1 memory=46.6 GiB"
    assert view.log_tail(lone, 4) == b"6789" and view.log_tail(1, 4) == b""
    assert view.log_tail(99, 4) is None

    async def main() -> tuple[int, bytes]:
        async with Scheduler(
            port=0, dashboard_address="127.0.0.1:0", dashboard_runs=view
        ) as scheduler:
            assert scheduler.dashboard is not None
            link = scheduler.dashboard.login_link()
            port = scheduler.dashboard.origin.port if scheduler.dashboard.origin else 0
            login_target = link.partition(str(port))[2]
            _, headers, _ = await asyncio.to_thread(get, port, login_target)
            cookie = headers["set-cookie"].partition(";")[0]
            status, _, body = await asyncio.to_thread(
                get, port, f"/api/runs/{lone}/log?tail=3", cookie=cookie
            )
            _, _, doc = await asyncio.to_thread(get, port, "/api/status", cookie=cookie)
            assert json.loads(doc)["runs"]["counts"]["staged"] == 4
            return status, body

    assert asyncio.run(main()) == (200, b"789")


def test_closing_the_scheduler_ends_the_event_streams() -> None:
    async def main() -> bytes:
        scheduler = await Scheduler(port=0, dashboard_address="127.0.0.1:0").start()
        try:
            assert scheduler.dashboard is not None and scheduler.dashboard.origin is not None
            port = scheduler.dashboard.origin.port
            login_target = scheduler.dashboard.login_link().partition(str(port))[2]
            _, headers, _ = await asyncio.to_thread(get, port, login_target)
            cookie = headers["set-cookie"].partition(";")[0]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"GET /events?interval=10 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Cookie: {cookie}\r\n\r\n".encode()
            )
            first = await reader.readuntil(b"\n\n")  # the head and the first message's line
            while not first.endswith(b"}\n\n"):
                first += await reader.readuntil(b"\n\n")
        finally:
            await scheduler.close()
        rest = await asyncio.wait_for(reader.read(), 10)  # EOF: the stream was ended
        writer.close()
        return first + rest

    assert b"event: status\ndata: {" in asyncio.run(main())
