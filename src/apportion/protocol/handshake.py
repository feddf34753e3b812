"""Handshake, authentication and same-machine lending: what two peers say first.

Every connection starts here (``net/handshake.py``, ``net/auth.py``): ``Hello`` and
its answer, ``Welcome`` or ``Refused``; then the proofs that both sides know the
cluster's secret. ``LendBuffers`` and ``BuffersReturned`` are handled by the
connection itself (``net/lending.py``), never by the services above it.

The tags of ``Hello``, ``Welcome`` and ``Refused`` (1, 2, 3) never change, so that a
peer of another ``PROTOCOL_VERSION`` is still told so in words.
"""

from __future__ import annotations

from typing import Any

from apportion.protocol.base import Message, message


@message(1)
class Hello(Message):
    """First message of the connecting side. Nothing else is read before it is checked."""

    protocol: int
    role: str  #: "client", "worker" or "peer" (worker-to-worker and direct client data)
    name: str


@message(2)
class Welcome(Message):
    """The listener's answer to an acceptable ``Hello``."""

    protocol: int
    peer_id: str  #: how the listener will name this connection in logs and views
    info: dict[str, Any]


@message(3)
class Refused(Message):
    """The listener's answer to an unacceptable ``Hello``; the connection closes after it."""

    reason: str


@message(4)
class AuthHello(Message):
    """Connecting side -> listener, in the frame of its ``Hello``: my fresh nonce, and
    whom I speak for: a person the owner admitted (``core/people.py``), whose own
    secret I then prove, or "" for the owner, who proves the cluster's."""

    nonce: bytes
    person: str = ""


@message(5)
class AuthChallenge(Message):
    """Listener -> connecting side: my nonce, and my proof that I know the secret."""

    nonce: bytes
    proof: bytes


@message(6)
class AuthProof(Message):
    """Connecting side -> listener: my proof that I know the secret; then ``Welcome``."""

    proof: bytes


@message(7)
class LendBuffers(Message):
    """Receiver -> data port: I can read your memory (your ``Welcome`` probe was
    there); send the address of each buffer of ``from_bytes`` or more, not its bytes."""

    from_bytes: int


@message(8)
class BuffersReturned(Message):
    """Receiver -> data port: the buffers lent in your next ``frames`` lending frames
    (in the order sent) are read; they need not stay alive for me any longer."""

    frames: int
