"""The first exchange on every connection: protocol version, then (later) credentials.

Nothing but a small ``Hello`` is read from a peer before it is accepted, and no
payload is ever unpickled here.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from apportion.net import lending
from apportion.net.connection import Connection
from apportion.net.stream import Stream, StreamClosed
from apportion.net.transport import transport_for
from apportion.protocol.codec import (
    HEADER,
    MAX_FRAME,
    MAX_HANDSHAKE_FRAME,
    ProtocolError,
    decode_body,
    frame_sizes,
)
from apportion.protocol.messages import PROTOCOL_VERSION, Hello, Message, Refused, Welcome


class HandshakeError(ConnectionError):
    """The peer refused us, or spoke something other than our protocol."""


def version_mismatch(ours: int, theirs: int, what: str) -> str:
    return (
        f"protocol version mismatch: this side speaks version {ours}, the {what} speaks "
        f"version {theirs}; install the same apportion release on both"
    )


async def open_connection(
    address: str, role: str, name: str, *, timeout: float = 10.0, borrow: bool = False
) -> tuple[Connection, Welcome]:
    """Connect to ``address`` and complete the handshake as ``role``, within ``timeout``.
    With ``borrow``, read the large buffers the peer sends from its memory instead of
    the socket, if it offered to lend them and runs on this machine (``net/lending.py``).

    The address's scheme chooses the transport (``transport_for``): TCP or in memory.

    Failures are one line naming the address and what was found there: ``OSError``
    when nothing could be reached (refused at once, or no answer in time), and
    ``HandshakeError`` when something answered that is not an apportion peer of
    this version (its first bytes are quoted), or refused us.
    """
    transport = transport_for(address)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        stream = await asyncio.wait_for(transport.connect(address), timeout)
    except TimeoutError:
        raise OSError(f"cannot connect to {address}: no answer within {timeout:g}s") from None
    except ConnectionRefusedError:
        raise ConnectionRefusedError(f"cannot connect to {address}: connection refused") from None
    except OSError as exc:
        raise OSError(f"cannot connect to {address}: {exc.strerror or exc}") from None
    conn = Connection(stream, max_frame=MAX_HANDSHAKE_FRAME)
    conn.send(Hello(PROTOCOL_VERSION, role, name))
    try:
        reply = await asyncio.wait_for(_first_frame(stream), max(0.0, deadline - loop.time()))
    except TimeoutError:
        conn.abort()
        raise HandshakeError(
            f"{address}: no apportion handshake: no answer within {timeout:g}s"
        ) from None
    except _PeerGone as exc:
        conn.abort()
        raise HandshakeError(f"{address}: the handshake did not complete: {exc}") from None
    except HandshakeError as exc:
        conn.abort()
        raise HandshakeError(f"{address}: no apportion handshake: {exc}") from None
    first = reply[0] if reply else None
    if isinstance(first, Refused):
        await conn.close()
        raise HandshakeError(f"{address} refused the connection: {first.reason}")
    if not isinstance(first, Welcome):
        await conn.close()
        raise HandshakeError(f"{address}: no apportion handshake: the peer sent {first!r}")
    if first.protocol != PROTOCOL_VERSION:
        await conn.close()
        raise HandshakeError(version_mismatch(PROTOCOL_VERSION, first.protocol, "server"))
    conn.max_frame = MAX_FRAME
    lender = lending.lender_in(first.info) if borrow else None
    if lender is not None:
        conn.borrow_from(lender)
    return conn, first


#: Bytes of a non-apportion answer quoted in the error (an HTTP status line fits).
QUOTED_BYTES = 40


class _PeerGone(HandshakeError):
    """The peer went away before answering: said as such, not as a foreign peer (a
    worker that died while a peer was connecting to it is the common case)."""


async def _first_frame(stream: Stream) -> list[Message]:
    """The reply to our ``Hello``, read raw so that a foreign answer can be quoted."""
    try:
        header = await stream.read_exactly(HEADER.size)
    except StreamClosed as exc:
        if not exc.partial:
            raise _PeerGone("the peer closed the connection without a word") from None
        raise HandshakeError(_closed_text(exc.partial)) from None
    try:
        length, count = frame_sizes(header, MAX_HANDSHAKE_FRAME)
        if count:
            raise ProtocolError("a handshake carries no payload")
    except ProtocolError:
        raise HandshakeError(f"the peer sent {await _sample(stream, bytes(header))!r}") from None
    try:
        body = await stream.read_exactly(length)
    except StreamClosed as exc:
        raise HandshakeError(_closed_text(bytes(header) + exc.partial)) from None
    try:
        return decode_body(body)
    except ProtocolError:
        raise HandshakeError(f"the peer sent {(bytes(header) + body)[:QUOTED_BYTES]!r}") from None


def _closed_text(partial: bytes) -> str:
    return f"the peer sent {partial[:QUOTED_BYTES]!r} and closed the connection"


async def _sample(stream: Stream, head: bytes) -> bytes:
    """``head`` and what follows it at once, up to ``QUOTED_BYTES``, for an error message."""
    with contextlib.suppress(TimeoutError, ConnectionError):
        head += await asyncio.wait_for(stream.read_some(QUOTED_BYTES - len(head)), 0.2)
    return head[:QUOTED_BYTES]


async def accept_connection(
    conn: Connection, roles: set[str], peer_id: str, info: dict[str, Any], *, timeout: float = 10.0
) -> Hello:
    """Check the peer's ``Hello``; answer ``Welcome`` or ``Refused`` (and raise)."""
    conn.max_frame = MAX_HANDSHAKE_FRAME
    try:
        batch = await asyncio.wait_for(conn.recv(), timeout)
    except TimeoutError:
        raise HandshakeError(f"{conn.peer} sent no handshake within {timeout}s") from None
    hello = batch[0] if len(batch) == 1 else None
    if not isinstance(hello, Hello):
        raise HandshakeError(f"{conn.peer} did not start with a handshake")
    reason = None
    if hello.protocol != PROTOCOL_VERSION:
        reason = version_mismatch(PROTOCOL_VERSION, hello.protocol, hello.role or "peer")
    elif hello.role not in roles:
        reason = f"role {hello.role!r} is not served here (expected one of {sorted(roles)})"
    if reason is not None:
        conn.send(Refused(reason))
        await conn.close()
        raise HandshakeError(reason)
    conn.send(Welcome(PROTOCOL_VERSION, peer_id, info))
    conn.max_frame = MAX_FRAME
    return hello
