"""The first exchange on every connection: protocol version, then (later) credentials.

Nothing but a small ``Hello`` is read from a peer before it is accepted, and no
payload is ever unpickled here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from apportion.net.address import parse_address
from apportion.net.connection import Connection, ConnectionClosed
from apportion.protocol.codec import MAX_FRAME, MAX_HANDSHAKE_FRAME, ProtocolError
from apportion.protocol.messages import PROTOCOL_VERSION, Hello, Refused, Welcome


class HandshakeError(ConnectionError):
    """The peer refused us, or spoke something other than our protocol."""


def version_mismatch(ours: int, theirs: int, what: str) -> str:
    return (
        f"protocol version mismatch: this side speaks version {ours}, the {what} speaks "
        f"version {theirs}; install the same apportion release on both"
    )


async def open_connection(
    address: str, role: str, name: str, *, timeout: float = 10.0
) -> tuple[Connection, Welcome]:
    """Connect to ``address`` and complete the handshake as ``role``."""
    host, port = parse_address(address)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as exc:
        raise OSError(f"cannot connect to {address}: {exc}") from exc
    conn = Connection(reader, writer, max_frame=MAX_HANDSHAKE_FRAME)
    conn.send(Hello(PROTOCOL_VERSION, role, name))
    try:
        reply = await asyncio.wait_for(conn.recv(), timeout)
    except (ConnectionClosed, ProtocolError, TimeoutError) as exc:
        await conn.close()
        raise HandshakeError(f"handshake with {address} failed: {exc!r}") from None
    first = reply[0] if reply else None
    if isinstance(first, Refused):
        await conn.close()
        raise HandshakeError(f"{address} refused the connection: {first.reason}")
    if not isinstance(first, Welcome):
        await conn.close()
        raise HandshakeError(f"{address} did not answer the handshake")
    if first.protocol != PROTOCOL_VERSION:
        await conn.close()
        raise HandshakeError(version_mismatch(PROTOCOL_VERSION, first.protocol, "server"))
    conn.max_frame = MAX_FRAME
    return conn, first


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
