"""A person admitted by the owner proves their own secret, at a listener that knows it."""

from __future__ import annotations

import asyncio

import pytest

from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import Admitted, HandshakeError, accept_connection, open_connection
from apportion.net.memory import MEMORY
from apportion.net.person_token import person_token
from apportion.net.security import AuthenticationError, Security
from apportion.net.stream import Stream

pytestmark = pytest.mark.timeout(30)

CLUSTER = Security.in_memory()
#: The people this listener admits, and their secrets.
SECRETS = {"alice": "a" * 64}


def _connect_as(token: str, role: str = "client") -> list[object]:
    """Connect with ``token`` as ``role``; what the listener admitted, or the error."""
    seen: list[object] = []

    async def serve(stream: Stream) -> None:
        conn = Connection(stream)
        try:
            seen.append(
                await accept_connection(
                    conn,
                    {"client", "worker"},
                    "p",
                    {},
                    security=CLUSTER,
                    people=lambda name: SECRETS[name].encode() if name in SECRETS else None,
                )
            )
        except HandshakeError as exc:
            seen.append(str(exc))
        except ConnectionClosed:
            seen.append("closed by the connecting side")

    async def main() -> None:
        server = await MEMORY.listen("inproc://", 0, serve)
        security = Security(token=token, token_source="a test")
        try:
            conn, _ = await open_connection(server.address, role, "c", security=security)
            conn.abort()
        except (AuthenticationError, HandshakeError) as exc:
            seen.append(type(exc).__name__)
        await asyncio.sleep(0.05)
        server.close()

    asyncio.run(main())
    return seen


def test_a_person_with_their_secret_is_admitted_as_themselves() -> None:
    admitted = _connect_as(person_token("alice", SECRETS["alice"]))
    assert isinstance(admitted[0], Admitted) and admitted[0].person == "alice"
    owner = _connect_as(str(CLUSTER.token))
    assert isinstance(owner[0], Admitted) and owner[0].person == ""


@pytest.mark.parametrize(
    "token",
    [
        person_token("alice", "b" * 64),  # her name, a wrong secret
        person_token("bob", "a" * 64),  # nobody admitted by that name
        person_token("alice", str(CLUSTER.token)),  # the cluster's secret under her name
    ],
    # Named, not shown: the cluster's secret is made afresh in each process, and test
    # ids must be the same in every one (pytest-xdist compares them).
    ids=["wrong-secret", "unknown-name", "cluster-secret"],
)
def test_a_stranger_is_refused_as_a_wrong_secret_is(token: str) -> None:
    # The listener's own proof, made with the key it holds for that name (or with a
    # key nobody knows), fails at the connecting side: as with a wrong cluster secret.
    assert sorted(map(str, _connect_as(token))) == sorted(
        ["closed by the connecting side", "AuthenticationError"]
    )
    assert sorted(map(str, _connect_as("w" * 64))) == sorted(
        ["closed by the connecting side", "AuthenticationError"]
    )


def test_a_person_s_credential_cannot_connect_a_worker() -> None:
    refused = _connect_as(person_token("alice", SECRETS["alice"]), role="worker")
    assert "alice's credential connects clients only: a worker needs the cluster's secret" in (
        refused
    )
