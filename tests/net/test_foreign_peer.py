"""What answered when a peer is not a scheduler, named from its first bytes (pure)."""

from __future__ import annotations

import asyncio
import socketserver
import threading

import pytest

from apportion.net.foreign_peer import foreign_text, is_dashboard, peer_kind
from apportion.net.handshake import HandshakeError, open_connection
from apportion.net.security import Security

DASHBOARD_400 = b"HTTP/1.1 400 Bad Request\r\nServer: apportion\r\nContent-Type: text/plain\r\n"
NGINX_400 = b"HTTP/1.1 400 Bad Request\r\nServer: nginx/1.25.3\r\nDate: Fri, 27 Nov 2026\r\n"
SSH_BANNER = b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n"
TLS_ALERT = b"\x15\x03\x03\x00\x02\x02\x32"


def test_peers_are_told_apart_by_their_first_bytes() -> None:
    assert peer_kind(DASHBOARD_400) == "HTTP" and is_dashboard(DASHBOARD_400)
    assert peer_kind(NGINX_400) == "HTTP" and not is_dashboard(NGINX_400)
    assert peer_kind(SSH_BANNER) == "SSH" and not is_dashboard(SSH_BANNER)
    assert peer_kind(TLS_ALERT) == "TLS"
    assert peer_kind(b"\x00\x00\x00\x00\x00\x00\x00\x05") is None


def test_our_dashboard_is_named_with_where_the_scheduler_is_when_known() -> None:
    text = foreign_text("127.0.0.1:8787", DASHBOARD_400, dashboard_of="tcp://127.0.0.1:8786")
    assert text == (
        "127.0.0.1:8787 is apportion's dashboard (HTTP), not a scheduler; "
        "the scheduler is at tcp://127.0.0.1:8786"
    )
    unknown = foreign_text("h:8787", DASHBOARD_400)
    assert unknown.startswith("h:8787 is apportion's dashboard (HTTP), not a scheduler; give")


def test_other_servers_are_named_and_quoted_in_one_line() -> None:
    http = foreign_text("h:80", NGINX_400)
    assert http.startswith("h:80: no apportion handshake: an HTTP server answered (b'HTTP/1.1 400")
    assert http.endswith("), not a scheduler") and "\n" not in http
    assert "an SSH server answered (b'SSH-2.0-OpenSSH" in foreign_text("h:22", SSH_BANNER)
    assert "reached at tls://host:port" in foreign_text("h:8786", TLS_ALERT)
    other = foreign_text("h:1", b"\x01\x02", closed=True)
    assert (
        other
        == "h:1: no apportion handshake: the peer sent b'\\x01\\x02' and closed the connection"
    )


@pytest.mark.tcp
def test_a_client_at_an_ssh_port_is_told_it_is_an_ssh_server() -> None:
    """An SSH server speaks first; the client's error names it, in one line."""

    class Banner(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(SSH_BANNER)
            self.request.recv(1024)
            self.request.sendall(b"Invalid SSH identification string.\r\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Banner)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(HandshakeError) as info:
            asyncio.run(
                open_connection(address, "client", "t", security=Security.in_memory(), timeout=5)
            )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert str(info.value) == (
        f"{address}: no apportion handshake: an SSH server answered "
        f"({SSH_BANNER[:40]!r}), not a scheduler"
    )
