"""Both ends prove the secret; a recorded, reflected or wrong proof is refused.

The proofs are pure (``net/auth.py``); the handshake that carries them is driven
here over the in-memory transport, with a listener and a connecting side that hold
the same secret, different ones, or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.net import auth
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.door import Door
from apportion.net.handshake import HandshakeError, accept_connection, open_connection
from apportion.net.memory import MEMORY
from apportion.net.security import AuthenticationError, MissingSecretError, Security
from apportion.net.stream import Stream
from apportion.protocol.base import PROTOCOL_VERSION
from apportion.protocol.codec import ProtocolError
from apportion.protocol.handshake import (
    AuthChallenge,
    AuthHello,
    AuthProof,
    Hello,
    Refused,
    Welcome,
)
from apportion.protocol.tasks import KeysDone
from apportion.protocol.worker import Heartbeat

pytestmark = pytest.mark.timeout(30)

KEY = b"k" * 32
NONCES = st.binary(min_size=auth.NONCE_BYTES, max_size=auth.NONCE_BYTES)


# --- the proofs -------------------------------------------------------------------------


@given(NONCES, NONCES)
def test_a_proof_is_bound_to_both_nonces_and_to_its_side(ours: bytes, theirs: bytes) -> None:
    proof = auth.proof(KEY, auth.CONNECTOR, "client", "c", ours, theirs)
    assert auth.verify(proof, auth.proof(KEY, auth.CONNECTOR, "client", "c", ours, theirs))
    if ours != theirs:
        assert proof != auth.proof(KEY, auth.CONNECTOR, "client", "c", theirs, ours)
    # The listener's proof over the same nonces is not the connecting side's.
    assert proof != auth.proof(KEY, auth.LISTENER, "client", "c", ours, theirs)
    assert proof != auth.proof(KEY, auth.CONNECTOR, "worker", "c", ours, theirs)
    assert proof != auth.proof(b"x" * 32, auth.CONNECTOR, "client", "c", ours, theirs)


def test_fields_cannot_run_into_each_other() -> None:
    # "ab" + "c" and "a" + "bc" are different peers: the transcript says where each ends.
    one = auth.proof(KEY, auth.CONNECTOR, "ab", "c", b"n", b"m")
    assert one != auth.proof(KEY, auth.CONNECTOR, "a", "bc", b"n", b"m")


def test_a_short_secret_is_refused_naming_where_it_came_from() -> None:
    with pytest.raises(ValueError, match="secret from APPORTION_TOKEN has 5 characters"):
        Security(token="short", token_source="APPORTION_TOKEN").key()
    with pytest.raises(MissingSecretError, match="no secret to connect with"):
        Security().key()


# --- the handshake ----------------------------------------------------------------------


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())  # type: ignore[arg-type]


class Listener:
    """An in-memory listener holding ``security`` that records how each handshake ended."""

    def __init__(self, security: Security, timeout: float = 5.0) -> None:
        self.security = security
        self.timeout = timeout
        self.outcomes: list[str] = []
        self.served = 0
        #: Set as each handshake ends, whichever way.
        self.ended = asyncio.Event()

    async def serve(self, stream: Stream) -> None:
        conn = Connection(stream)
        try:
            await accept_connection(
                conn, {"client"}, "p", {}, security=self.security, timeout=self.timeout
            )
        except (HandshakeError, ProtocolError, ConnectionClosed) as exc:
            self.outcomes.append(str(exc))
            self.ended.set()
            conn.abort()
            return
        self.outcomes.append("welcome")
        self.ended.set()
        with contextlib.suppress(ConnectionClosed):
            for message in await conn.recv():
                self.served += 1
                conn.send(message)
        await conn.close()


async def _listen(listener: Listener) -> str:
    server = await MEMORY.listen("inproc://", 0, listener.serve)
    return server.address


def test_the_same_secret_on_both_sides_connects() -> None:
    shared = Security.in_memory()

    async def main() -> None:
        listener = Listener(shared)
        address = await _listen(listener)
        conn, welcome = await open_connection(address, "client", "c", security=shared)
        conn.send(Heartbeat(1, 2))
        assert await conn.recv() == [Heartbeat(1, 2)]
        await conn.close()
        assert welcome.peer_id == "p" and listener.outcomes == ["welcome"]

    run(main)


def test_a_wrong_secret_is_refused_on_both_sides() -> None:
    async def main() -> None:
        listener = Listener(Security.in_memory())
        address = await _listen(listener)
        stranger = Security(token="s" * 32, token_source="a test")
        with pytest.raises(AuthenticationError, match="does not know the secret this side holds"):
            await open_connection(address, "client", "c", security=stranger)
        await asyncio.wait_for(listener.ended.wait(), 5)
        # The listener proved itself first; the stranger stopped there and said nothing.
        assert listener.served == 0 and listener.outcomes[0] != "welcome"

    run(main)


async def _raw(address: str) -> Connection:
    return Connection(await MEMORY.connect(address))


def test_a_connection_without_a_proof_is_refused_and_its_frame_never_read() -> None:
    async def main() -> None:
        listener = Listener(Security.in_memory())
        address = await _listen(listener)
        conn = await _raw(address)
        conn.send(Hello(PROTOCOL_VERSION, "client", "c"))  # no AuthHello
        reply = await conn.recv()
        assert isinstance(reply[0], Refused) and "no authentication" in reply[0].reason
        assert listener.served == 0

    run(main)


def test_a_recorded_proof_is_refused_on_a_new_connection() -> None:
    """The replay: a proof that was good on one connection, sent again on another."""
    shared = Security.in_memory()
    key = shared.key()

    async def prove(address: str, nonce: bytes, answer: bytes | None) -> tuple[bytes, list[Any]]:
        conn = await _raw(address)
        conn.send(Hello(PROTOCOL_VERSION, "client", "c"))
        conn.send(AuthHello(nonce))
        (challenge,) = await conn.recv()
        assert isinstance(challenge, AuthChallenge)
        good = auth.proof(key, auth.CONNECTOR, "client", "c", nonce, challenge.nonce)
        conn.send(AuthProof(answer if answer is not None else good))
        try:
            reply = await conn.recv()
        except ConnectionClosed:
            reply = []
        conn.abort()
        return good, reply

    async def main() -> None:
        listener = Listener(shared)
        address = await _listen(listener)
        nonce = b"n" * auth.NONCE_BYTES
        recorded, first = await prove(address, nonce, None)
        assert isinstance(first[0], Welcome)
        # Same nonce, same recorded proof: the listener's nonce changed, so it fails.
        _, second = await prove(address, nonce, recorded)
        assert isinstance(second[0], Refused)
        assert second[0].reason.startswith("authentication failed")

    run(main)


def test_a_peer_that_stops_mid_handshake_is_dropped_at_the_deadline() -> None:
    async def main() -> None:
        listener = Listener(Security.in_memory(), timeout=0.2)
        address = await _listen(listener)
        conn = await _raw(address)
        conn.send(Hello(PROTOCOL_VERSION, "client", "c"))
        conn.send(AuthHello(b"n" * auth.NONCE_BYTES))
        await conn.recv()  # the challenge; then this side says nothing more
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(conn.recv(), 5)
        assert "did not complete the handshake within 0.2s" in listener.outcomes[0]

    run(main)


def test_a_client_refuses_a_listener_that_does_not_know_the_secret() -> None:
    """A process that took the scheduler's port (another user) cannot pass for it."""

    async def impostor(stream: Stream) -> None:
        conn = Connection(stream)
        _, start = await conn.recv()
        assert isinstance(start, AuthHello)
        guess = auth.proof(b"g" * 32, auth.LISTENER, "client", "c", start.nonce, b"s" * 32)
        conn.send(AuthChallenge(b"s" * 32, guess))
        with contextlib.suppress(ConnectionClosed):
            await conn.recv()
        conn.abort()

    async def main() -> None:
        server = await MEMORY.listen("inproc://", 0, impostor)
        with pytest.raises(AuthenticationError, match="does not know the secret"):
            await open_connection(
                server.address, "client", "c", security=Security.in_memory(), timeout=2
            )

    run(main)


def test_a_door_logs_one_line_per_host_for_many_refusals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    door_logger = logging.getLogger("apportion.test-door")
    door = Door({"client"}, Security.in_memory(), door_logger)

    async def serve(stream: Stream) -> None:
        await door.admit(Connection(stream), "p", {})

    async def main() -> None:
        server = await MEMORY.listen("inproc://", 0, serve)
        for _ in range(5):
            conn = await _raw(server.address)
            conn.send(KeysDone(["x"]))  # not a handshake
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait_for(conn.recv(), 5)
            conn.abort()
        assert door.gate.pending() == 0

    with caplog.at_level(logging.WARNING, logger="apportion.test-door"):
        run(main)
    assert caplog.text.count("refused a connection") == 1
