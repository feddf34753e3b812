"""Where a listener lets connections in: the handshake, within the gate's bounds.

The scheduler and every worker's data port admit connections here. A connection
that has not proved the secret yet costs a socket, a task, its stream's read buffer
and a 64 KiB frame at most, and only so many of them may wait (``net/gate.py``: the
oldest pending one from the same address is dropped for a new one, so a peer
trickling bytes cannot lock out a legitimate client of the same login node).
Refusals are logged once per host and window, not once per connection. Once
admitted, a peer that stalls in the middle of a frame is dropped (``STALL_TIMEOUT``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from apportion.net.address import is_inproc
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.gate import HandshakeGate
from apportion.net.handshake import Admitted, HandshakeError, PersonKeys, accept_connection
from apportion.net.security import Security
from apportion.net.stream import STALL_TIMEOUT
from apportion.protocol.codec import ProtocolError


def host_of(peer: str) -> str:
    """The host part of ``host:port``; ``inproc`` for every in-memory peer (this process)."""
    if is_inproc(peer):
        return "inproc"
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


class Door:
    """Admits the connections of one listener (see the module docstring)."""

    def __init__(
        self,
        roles: set[str],
        security: Security,
        logger: logging.Logger,
        people: PersonKeys | None = None,
    ) -> None:
        self.roles = roles
        self.security = security
        #: The keys of the people admitted here (the scheduler's); None: none is.
        self.people = people
        self.gate = HandshakeGate()
        self._logger = logger

    async def admit(self, conn: Connection, peer_id: str, info: dict[str, Any]) -> Admitted | None:
        """The peer's ``Hello`` and person once it proved the secret; None if it was
        refused, gave up or was dropped for a newer connection (logged, within bounds)."""
        host = host_of(conn.peer)
        now = time.monotonic()
        for summary in self.gate.refusals.overdue(now):
            self._logger.warning(summary)
        # Peers in memory are this process: no bound on them, they are trusted anyway.
        evicted = [] if is_inproc(conn.peer) else self.gate.admit(conn, host, now)
        for dropped in evicted:
            assert isinstance(dropped, Connection)
            dropped.abort()  # its pending read fails, and its own admit says so
        try:
            admitted = await accept_connection(
                conn, self.roles, peer_id, info, security=self.security, people=self.people
            )
        except (HandshakeError, ProtocolError, ConnectionClosed) as exc:
            reason = str(exc) or "the peer closed the connection during the handshake"
            for line in self.gate.refusal_lines(host, reason, time.monotonic()):
                self._logger.warning(line)
            conn.abort()
            return None
        finally:
            self.gate.done(conn)
        conn.stall_timeout = STALL_TIMEOUT
        return admitted
