"""The worker's data port: peers and clients fetch results here with ``GetData``,
and call the actors living here with ``ActorCall``.

Every connection is handshaken before anything else is read from it, and a peer
that sends garbage or an unexpected message loses its own connection only; the
worker and every other connection carry on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from apportion.core.payload import Pickled, size_of
from apportion.net import lending
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.door import Door
from apportion.net.security import Security, check_exposure, listening, stopped_listening
from apportion.net.stream import Listener, Stream
from apportion.net.transport import listener_for
from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError
from apportion.protocol.peer_data import ActorCall, DataReply, DataStored, GetData, PutData
from apportion.worker.still_pickled import pickled

logger = logging.getLogger("apportion.worker")

#: Who may connect to a data port: other workers, clients fetching results directly,
#: and the scheduler forwarding large results to clients that cannot reach us.
DATA_ROLES = frozenset({"peer", "client", "scheduler"})
#: Replies of this many bytes or more are sent before the next request is answered,
#: instead of leaving with the other replies to the same frame of requests.
SEND_ALONE_FROM = 1 << 20


def data_reply(data: Mapping[str, Any], request_id: int, keys: Iterable[str]) -> DataReply:
    """Pickle the requested values; keys not held are missing, unpicklable ones errors."""
    found: dict[str, Pickled] = {}
    missing: list[str] = []
    errors: dict[str, str] = {}
    for key in keys:
        try:
            value = data[key]
        except KeyError:
            missing.append(key)
            continue
        try:
            found[key] = pickled(value)  # one arrived from elsewhere as it came
        except Exception as exc:
            # Not "missing": the value exists and will never travel. Saying so lets the
            # scheduler fail its dependents instead of recomputing it again and again.
            errors[key] = f"the result of {key!r} ({type(value).__name__}) cannot be pickled: {exc}"
            logger.warning("%s", errors[key])
    return DataReply(request_id, found, missing, errors)


def reply_parts(data: Mapping[str, Any], request_id: int, keys: Iterable[str]) -> list[DataReply]:
    """``data_reply`` in parts (``GetData.in_parts``): the small values with the keys
    missing and the errors first, then each value of ``SEND_ALONE_FROM`` bytes or more
    alone, in the order asked."""
    whole = data_reply(data, request_id, keys)
    large = {key: blob for key, blob in whole.data.items() if size_of(blob) >= SEND_ALONE_FROM}
    small = {key: blob for key, blob in whole.data.items() if key not in large}
    alone = [DataReply(request_id, {key: blob}, [], {}) for key, blob in large.items()]
    if alone and not (small or whole.missing or whole.errors):
        return alone
    return [DataReply(request_id, small, whole.missing, whole.errors), *alone]


class DataServer:
    """Listens on ``host:port`` and answers ``GetData`` from ``data``."""

    def __init__(
        self,
        data: Mapping[str, Any],
        name: str,
        host: str,
        port: int,
        on_put: Callable[[PutData], DataStored] | None = None,
        on_actor: Callable[[ActorCall, Connection], None] | None = None,
        *,
        security: Security,
        allow_plaintext: bool = False,
    ) -> None:
        self._data = data
        #: What every peer must prove (and show, on ``tls://``) before it is served.
        self._security = security
        self._door = Door(set(DATA_ROLES), security, logger)
        self._allow_plaintext = allow_plaintext
        #: Stores data a client puts here directly (``direct_to_workers``).
        self._on_put = on_put
        #: Starts a call on an actor living here; it answers on the connection.
        self._on_actor = on_actor
        self._name = name
        self._host = host
        self._port = port
        self._server: Listener | None = None
        self._conns: set[Connection] = set()
        self.address = ""
        #: Bytes of results served to peers (other workers) since the server was made:
        #: their pickled size, as ``size_of`` reads it. Not what clients fetch directly
        #: nor what the scheduler relays to a client or copies between workers: so the
        #: cluster's totals of ``sent`` and of ``PeerPool.received`` count the same
        #: transfers, worker to worker.
        self.sent = 0

    async def start(self) -> str:
        """Start listening; returns the address peers should use, ``tcp://host:port``
        (``inproc://name`` when ``host`` is in memory)."""
        check_exposure(self._host, self._security, allow_plaintext=self._allow_plaintext)
        transport = listener_for(self._host, self._security, "worker")
        self._server = await transport.listen(self._host, self._port, self._serve)
        self.address = self._server.address
        listening(self.address, self._security)
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            stopped_listening(self.address)
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _greet(self, conn: Connection) -> str:
        """The handshake, offering to lend large buffers to a peer on this machine;
        the role the other side connected as."""
        info = {"worker": self._name, **lending.offer()}
        admitted = await self._door.admit(conn, conn.peer, info)
        if admitted is None:
            raise ConnectionClosed("refused")  # said by the door, within bounds
        hello = admitted.hello
        if "lender" in info:
            conn.offer_lending()
        return hello.role

    async def _serve(self, stream: Stream) -> None:
        conn = Connection(stream)
        self._conns.add(conn)
        try:
            peer = await self._greet(conn) == "peer"
            while True:
                await self._answer_all(await conn.recv(), conn, peer)
        except ConnectionClosed:
            pass
        except ProtocolError as exc:
            logger.warning(
                "data port %s: dropping connection from %s: %s",
                self.address,
                conn.peer,
                str(exc),  # not the exception: its traceback holds the connection
            )
            conn.abort()
        except Exception:
            logger.exception(
                "data port %s: error serving %s; connection dropped", self.address, conn.peer
            )
            conn.abort()
        finally:
            self._conns.discard(conn)
            await conn.close()

    async def _answer_all(self, messages: list[Message], conn: Connection, peer: bool) -> None:
        """Answer the requests of one frame, in order. A call of its own so that none
        of them outlives it: a local of ``_serve`` would keep the last request (a
        ``PutData``'s values) alive while the connection waits for the next frame."""
        for message in messages:
            await self._answer(message, conn, peer)

    async def _answer(self, message: Message, conn: Connection, peer: bool) -> None:
        """Answer one request; anything not served here is a protocol error. ``peer``:
        it came from another worker (what it gets counts in ``sent``)."""
        if isinstance(message, GetData) and message.in_parts:
            parts = reply_parts(self._data, message.request_id, message.keys)
            for part in parts:
                if peer and part.data:
                    self.sent += sum(map(size_of, part.data.values()))
                conn.send(part)
                if len(parts) > 1:
                    await conn.drain()  # each part a frame of its own
            # One part holds only small values: it may share a frame with the answers
            # to the other requests of this loop turn.
        elif isinstance(message, GetData):
            reply = data_reply(self._data, message.request_id, message.keys)
            conn.send(reply)
            nbytes = sum(map(size_of, reply.data.values()))
            if peer:
                self.sent += nbytes
            if nbytes >= SEND_ALONE_FROM:
                # Let it leave before the next request is answered, so the asker can
                # use it while the next one is on its way.
                await conn.drain()
        elif isinstance(message, PutData) and self._on_put is not None:
            conn.send(self._on_put(message))
        elif isinstance(message, ActorCall) and self._on_actor is not None:
            self._on_actor(message, conn)
        else:
            raise ProtocolError(f"{type(message).__name__} is not served on a data port")
