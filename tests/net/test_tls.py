"""TLS streams carry frames as plain streams do, authenticate peers under mutual TLS,
and drop whoever fails the TLS handshake without disturbing the listener."""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from apportion.core.payload import Payload, dumps, loads
from apportion.net.certificates import client_context, server_context, temporary_certificates
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.stream import LOW_WATER, READ_BUFFER, Stream, StreamClosed
from apportion.net.tls import (
    TlsListener,
    TlsStream,
    connect_tls,
    format_tls_address,
    listen_tls,
)
from apportion.protocol.base import Message
from apportion.protocol.peer_data import PutData
from apportion.protocol.tasks import KeysDone
from apportion.protocol.worker import Heartbeat
from tls_certificates import issue

pytestmark = [pytest.mark.timeout(60), pytest.mark.tcp]


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


# --- certificates ------------------------------------------------------------------------


def encrypt(key_pem: str) -> str:
    """``key_pem`` encrypted with a password."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem.encode(), None)
    encryption = serialization.BestAvailableEncryption(b"secret")
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    return pem.decode()


@dataclass(frozen=True)
class Certs:
    """Files in a test's directory: the cluster's CA (which is also the server's
    certificate), a client certificate it signed, and another CA."""

    ca: str
    ca_key: str
    client: str
    client_key: str
    other_ca: str
    other_key: str

    def server(self, *, mutual: bool = True) -> ssl.SSLContext:
        return server_context(self.ca, self.ca_key, self.ca if mutual else None)


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    ca, ca_key = temporary_certificates()
    client, client_key = issue(ca, ca_key, "worker")
    other_ca, other_key = temporary_certificates()
    paths = {}
    for name, text in [
        ("ca", ca),
        ("ca_key", ca_key),
        ("client", client),
        ("client_key", client_key),
        ("other_ca", other_ca),
        ("other_key", other_key),
    ]:
        path = tmp_path / f"{name}.pem"
        path.write_text(text)
        paths[name] = str(path)
    return Certs(**paths)


# --- pairs of streams ----------------------------------------------------------------------


@asynccontextmanager
async def listening(
    context: ssl.SSLContext, *, handshake_timeout: float = 10.0
) -> AsyncIterator[tuple[TlsListener, asyncio.Queue[Stream]]]:
    """A TLS listener on a free port, and the streams it accepts."""
    accepted: asyncio.Queue[Stream] = asyncio.Queue()

    async def on_connect(stream: Stream) -> None:
        await accepted.put(stream)

    listener = await listen_tls(
        "127.0.0.1", 0, on_connect, context, handshake_timeout=handshake_timeout
    )
    try:
        yield listener, accepted
    finally:
        listener.close()
        await listener.wait_closed()
        while not accepted.empty():
            await _shut(accepted.get_nowait())


def port_of(listener: TlsListener) -> int:
    return int(listener.address.rsplit(":", 1)[1])


async def _shut(*streams: Stream) -> None:
    """Abort, then wait until each connection is gone (nothing left for the loop's end)."""
    for stream in streams:
        stream.abort()
    for stream in streams:
        await stream.close()


@asynccontextmanager
async def tls_pair(
    server: ssl.SSLContext, client: ssl.SSLContext
) -> AsyncIterator[tuple[TlsStream, TlsStream]]:
    """Two connected ends: the client's, and the listener's."""
    async with listening(server) as (listener, accepted):
        near = await connect_tls("127.0.0.1", port_of(listener), client)
        far = await accepted.get()
        assert isinstance(far, TlsStream)
        try:
            yield near, far
        finally:
            await _shut(near, far)


async def served(listener: TlsListener, accepted: asyncio.Queue[Stream], certs: Certs) -> None:
    """A good client still gets through, and its bytes arrive."""
    near = await connect_tls(
        "127.0.0.1", port_of(listener), client_context(certs.ca, certs.client, certs.client_key)
    )
    far = await asyncio.wait_for(accepted.get(), 10)
    try:
        near.write([b"still serving"])
        assert await far.read_exactly(13) == b"still serving"
    finally:
        await _shut(near, far)


def handshake_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "apportion.net"
        and r.levelno == logging.WARNING
        and "TLS handshake" in r.getMessage()
    ]


def no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


# --- carrying frames ----------------------------------------------------------------------


def test_messages_and_a_32_mib_payload_cross_a_tls_connection(certs: Certs) -> None:
    async def main() -> None:
        client = client_context(certs.ca, certs.client, certs.client_key)
        async with tls_pair(certs.server(), client) as (near, far):
            sender, receiver = Connection(near), Connection(far)
            data = bytes(range(256)) * (32 * 2**20 // 256)
            sender.send(KeysDone(["x"]))
            sender.send(PutData(7, {"big": dumps(data)}))
            got: list[Message] = []
            while len(got) < 2:
                got += await receiver.recv()
            assert got[0] == KeysDone(["x"])
            assert isinstance(got[1], PutData) and got[1].request_id == 7
            payload = got[1].data["big"]
            assert isinstance(payload, Payload) and loads(payload) == data
            receiver.send(KeysDone(["y"]))
            assert await sender.recv() == [KeysDone(["y"])]
            # Both sides were verified: each knows who the other is.
            assert far.peer_certificate is not None and near.peer_certificate is not None
            assert far.peer_certificate["subject"] == ((("commonName", "worker"),),)
            assert near.peer.startswith("127.0.0.1:") and far.peer.startswith("127.0.0.1:")

    run(main())


def test_bytes_arrive_in_order_through_the_buffer_and_straight_into_targets(
    certs: Certs,
) -> None:
    async def main() -> None:
        async with tls_pair(certs.server(mutual=False), client_context(None, None, None)) as (
            near,
            far,
        ):
            chunks = [bytes([i]) * (i * 7919 % 300_000) for i in range(1, 40)]
            for chunk in chunks:
                near.write([chunk, memoryview(chunk)[:1]])
            for chunk in chunks:
                if len(chunk) % 2:
                    assert await far.read_exactly(len(chunk)) == chunk
                else:
                    target = bytearray(len(chunk))
                    await far.read_into(memoryview(target))
                    assert target == chunk
                assert await far.read_exactly(1) == chunk[:1]
            # Without a CA nothing was verified, so no certificate is known.
            assert near.peer_certificate is None and far.peer_certificate is None

    run(main())


# --- who may connect ----------------------------------------------------------------------


def test_mutual_tls_refuses_a_client_without_a_certificate_and_goes_on_serving(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with listening(certs.server()) as (listener, accepted):
            port = port_of(listener)
            try:
                stream = await connect_tls("127.0.0.1", port, client_context(certs.ca, None, None))
            except OSError as exc:  # TLS 1.2: the handshake itself fails
                assert f"127.0.0.1:{port}" in str(exc)
            else:  # TLS 1.3: the server's refusal comes after the client's handshake
                conn = Connection(stream)
                conn.send(KeysDone(["x"]))
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(conn.recv(), 10)
                await _shut(stream)
            await served(listener, accepted, certs)

    with caplog.at_level(logging.INFO, logger="apportion.net"):
        run(main())
    (warning,) = handshake_warnings(caplog)
    assert "peer did not return a certificate" in warning and "\n" not in warning
    no_errors_logged(caplog)


def test_a_client_that_trusts_another_ca_refuses_the_server(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with listening(certs.server()) as (listener, accepted):
            port = port_of(listener)
            wrong = client_context(certs.other_ca, certs.client, certs.client_key)
            with pytest.raises(ssl.SSLCertVerificationError) as caught:
                await connect_tls("127.0.0.1", port, wrong)
            message = str(caught.value)
            assert message.startswith(f"TLS handshake with 127.0.0.1:{port} failed: ")
            assert "certificate verify failed" in message and "\n" not in message
            await served(listener, accepted, certs)

    with caplog.at_level(logging.INFO, logger="apportion.net"):
        run(main())
    no_errors_logged(caplog)


def test_a_client_certificate_from_another_ca_is_refused(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with listening(certs.server()) as (listener, accepted):
            stranger = client_context(certs.ca, certs.other_ca, certs.other_key)
            try:
                stream = await connect_tls("127.0.0.1", port_of(listener), stranger)
            except OSError:
                pass
            else:
                with pytest.raises(StreamClosed):
                    await asyncio.wait_for(stream.read_exactly(1), 10)
                await _shut(stream)
            await served(listener, accepted, certs)

    with caplog.at_level(logging.INFO, logger="apportion.net"):
        run(main())
    (warning,) = handshake_warnings(caplog)
    assert "certificate verify failed" in warning


def test_a_plain_tcp_client_is_dropped_and_the_listener_goes_on(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with listening(certs.server()) as (listener, accepted):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(listener))
            writer.write(b"\x00\x01 not a TLS hello at all \r\n" * 10)
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            await writer.wait_closed()
            await served(listener, accepted, certs)

    with caplog.at_level(logging.INFO, logger="apportion.net"):
        run(main())
    (warning,) = handshake_warnings(caplog)
    assert warning.startswith("listener tls://127.0.0.1:")
    no_errors_logged(caplog)


def test_a_peer_that_never_starts_the_handshake_is_dropped_after_the_timeout(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> float:
        async with listening(certs.server(), handshake_timeout=0.5) as (listener, accepted):
            loop = asyncio.get_running_loop()
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(listener))
            start = loop.time()
            assert await asyncio.wait_for(reader.read(), 10) == b""
            waited = loop.time() - start
            writer.close()
            await writer.wait_closed()
            await served(listener, accepted, certs)
            return waited

    with caplog.at_level(logging.INFO, logger="apportion.net"):
        waited = run(main())
    assert 0.4 <= waited < 5
    (warning,) = handshake_warnings(caplog)
    assert warning.endswith("no TLS handshake within 0.5s")


def test_a_failed_handshake_to_nothing_listening_is_a_plain_refusal() -> None:
    async def main() -> None:
        async with listening(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)) as (listener, _):
            port = port_of(listener)
        with pytest.raises(ConnectionRefusedError):
            await connect_tls("127.0.0.1", port, client_context(None, None, None))

    run(main())


# --- flow control and ends ------------------------------------------------------------


def test_a_reader_that_does_not_read_holds_the_writer_back_and_drain_waits(
    certs: Certs,
) -> None:
    async def main() -> None:
        async with tls_pair(certs.server(mutual=False), client_context(certs.ca, None, None)) as (
            near,
            far,
        ):
            chunk = bytes(range(256)) * (2 * 2**20 // 256)
            for _ in range(16):
                near.write([chunk])
            # What the socket beneath could not take waits in the SSL layer, counted.
            assert near.queued() > LOW_WATER
            drained = asyncio.ensure_future(near.drain())
            for _ in range(50):  # loop turns: far's buffer fills and it stops reading
                await asyncio.sleep(0)
            assert not drained.done()
            target = memoryview(bytearray(16 * len(chunk)))
            await far.read_into(target)
            await asyncio.wait_for(drained, 10)
            assert near.queued() <= LOW_WATER
            assert target == chunk * 16

    run(main())


def test_closing_lets_the_other_side_read_what_came_then_see_the_end(certs: Certs) -> None:
    async def main() -> None:
        async with tls_pair(certs.server(mutual=False), client_context(None, None, None)) as (
            near,
            far,
        ):
            near.write([b"abc"])
            closing = asyncio.ensure_future(near.close())
            with pytest.raises(StreamClosed) as caught:
                await far.read_exactly(10)
            assert caught.value.partial == b"abc" and far.closed
            await asyncio.wait_for(closing, 10)
            assert near.closed
            with pytest.raises(StreamClosed):
                await far.drain()

    run(main())


def test_a_connection_whose_peer_aborts_raises_connection_closed(certs: Certs) -> None:
    async def main() -> None:
        async with tls_pair(certs.server(mutual=False), client_context(None, None, None)) as (
            near,
            far,
        ):
            sender, receiver = Connection(near), Connection(far)
            sender.send(Heartbeat(1, 2))
            assert await receiver.recv() == [Heartbeat(1, 2)]
            sender.abort()
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(receiver.recv(), 10)

    run(main())


def test_closing_a_connection_while_the_peer_is_not_reading_is_bounded(certs: Certs) -> None:
    async def main() -> None:
        async with tls_pair(certs.server(mutual=False), client_context(None, None, None)) as (
            near,
            far,
        ):
            far.write([bytes(8 * 2**20)])  # near never reads it
            near.write([b"bye"])
            await asyncio.wait_for(near.close(), 12)
            assert await far.read_exactly(3) == b"bye"

    run(main())


def test_the_receive_buffer_is_never_empty() -> None:
    """The SSL layer would take an empty buffer for the end of the stream."""

    async def main() -> None:
        stream = TlsStream(asyncio.get_running_loop())
        view = stream.get_buffer(-1)
        size = len(view)
        view.release()
        stream.buffer_updated(size)  # full, and nobody reads
        assert size == READ_BUFFER and len(stream.get_buffer(-1)) > 0

    run(main())


# --- contexts and certificates ------------------------------------------------------------


def test_pem_text_serves_in_place_of_paths(
    certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temporary))
    text = {name: Path(path).read_text() for name, path in vars(certs).items()}
    server = server_context(text["ca"], text["ca_key"], text["ca"])
    client = client_context(text["ca"], text["client"], text["client_key"])
    assert list(temporary.iterdir()) == []  # the key's temporary file is gone

    async def main() -> None:
        async with tls_pair(server, client) as (near, far):
            near.write([b"pem"])
            assert await far.read_exactly(3) == b"pem"

    run(main())


def test_bad_files_are_one_line_errors_naming_the_file(certs: Certs, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ValueError, match=r"^certificate file '.*missing\.pem' does not exist$"):
        server_context(missing, certs.ca_key, None)
    not_pem = tmp_path / "not.pem"
    not_pem.write_bytes(b"\x30\x82\x01\x0a binary")
    with pytest.raises(ValueError, match=r"^CA file '.*not\.pem' is not PEM"):
        client_context(str(not_pem), None, None)
    with pytest.raises(
        ValueError, match=r"^key file '.*other_key\.pem' does not match certificate"
    ):
        server_context(certs.ca, certs.other_key, None)
    with pytest.raises(ValueError, match=r"holds no PEM private key$"):
        server_context(certs.ca, certs.ca, None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_text(encrypt(Path(certs.ca_key).read_text()))
    with pytest.raises(ValueError, match=r"^key file '.*encrypted\.pem' is encrypted"):
        server_context(certs.ca, str(encrypted), None)
    with pytest.raises(ValueError, match="no cipher matches"):
        client_context(None, None, None, ciphers="NOT-A-CIPHER")


def test_temporary_certificates_are_their_own_ca_for_local_addresses() -> None:
    from cryptography import x509

    cert_pem, key_pem = temporary_certificates()
    assert key_pem.startswith("-----BEGIN PRIVATE KEY-----")
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    assert cert.subject.rfc4514_string() == "CN=apportion" == cert.issuer.rfc4514_string()
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(days=365) <= lifetime <= datetime.timedelta(days=366)


def test_temporary_certificates_without_cryptography_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)
    with pytest.raises(ImportError, match=r"pip install 'apportion\[tls\]'"):
        temporary_certificates()


def test_tls_addresses_bracket_ipv6_hosts() -> None:
    assert format_tls_address("127.0.0.1", 8786) == "tls://127.0.0.1:8786"
    assert format_tls_address("::1", 8786) == "tls://[::1]:8786"


def test_silent_peers_past_the_bound_give_way_oldest_first_and_are_logged_once(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    crowd = 70  # past the 64 handshakes one host may have waiting

    async def main() -> None:
        async with listening(certs.server(), handshake_timeout=30) as (listener, accepted):
            peers = [
                await asyncio.open_connection("127.0.0.1", port_of(listener)) for _ in range(crowd)
            ]
            try:
                # The oldest are closed long before their 30 s handshake timeout.
                oldest, _ = peers[0]
                assert await asyncio.wait_for(oldest.read(), 10) == b""
                await served(listener, accepted, certs)
            finally:
                for _, writer in peers:
                    writer.close()

    with caplog.at_level(logging.WARNING, logger="apportion.net"):
        run(main())
    dropped = [r for r in caplog.records if "dropped for a newer connection" in r.getMessage()]
    assert len(dropped) == 1  # one line for the host, however many gave way
