"""The first exchange on every connection: protocol version, then proof of the secret.

::

    connecting side                          listener
    [Hello(version, role, name), AuthHello(nonce, person)]  ->
                                              <-  AuthChallenge(nonce, proof)
    (checks the listener's proof)
    AuthProof(proof)                          ->
                                              <-  Welcome(version, id, info)

Both sides prove they know the cluster's secret (``net/auth.py``) before anything
else is said; a person the owner admitted proves their own secret instead, which
only a listener that knows them (the scheduler, through ``people``) can check.
Until then only these small frames are read (``MAX_HANDSHAKE_FRAME``,
no payload buffers), and nothing is ever unpickled here. A version mismatch is
answered ``Refused`` before any proof, in words both versions understand; so is a
wrong proof, without saying more than that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from apportion.net import auth, lending
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.discovery import dashboard_owner
from apportion.net.foreign_peer import foreign_text, peer_kind
from apportion.net.scheduler_claim import own_sightings
from apportion.net.scheduler_file import default_scheduler_file
from apportion.net.security import HOW_TO_GIVE, AuthenticationError, Security
from apportion.net.stream import Stream, StreamClosed
from apportion.net.transport import transport_for
from apportion.protocol.base import PROTOCOL_VERSION, Message
from apportion.protocol.codec import (
    HEADER,
    MAX_FRAME,
    MAX_HANDSHAKE_FRAME,
    ProtocolError,
    decode_body,
    frame_sizes,
)
from apportion.protocol.handshake import (
    AuthChallenge,
    AuthHello,
    AuthProof,
    Hello,
    Refused,
    Welcome,
)

#: How a refusal for a wrong proof begins: the connecting side tells it from the others.
AUTH_FAILED = "authentication failed"

#: Seconds a connecting peer has to complete the whole handshake, proof included.
HANDSHAKE_TIMEOUT = 10.0


class HandshakeError(ConnectionError):
    """The peer refused us, or spoke something other than our protocol."""


class HandshakeDropped(HandshakeError):
    """The listener closed the connection before its handshake finished, without a word.

    A busy listener does that on purpose: its gate drops the oldest pending handshake
    from a host to admit a newer one (``net/gate.py``), as when hundreds of workers of
    one node start at once. Unlike a refusal, trying again later may well succeed.
    """


def version_mismatch(ours: int, theirs: int, what: str) -> str:
    return (
        f"protocol version mismatch: this side speaks version {ours}, the {what} speaks "
        f"version {theirs}; install the same apportion release on both"
    )


async def open_connection(
    address: str,
    role: str,
    name: str,
    *,
    security: Security,
    timeout: float = 10.0,
    borrow: bool = False,
) -> tuple[Connection, Welcome]:
    """Connect to ``address`` and complete the handshake as ``role``, within ``timeout``,
    proving the secret of ``security`` and checking that the listener knows it too.
    With ``borrow``, read the large buffers the peer sends from its memory instead of
    the socket, if it offered to lend them and runs on this machine (``net/lending.py``).

    The address's scheme chooses the transport (``transport_for``): TCP or in memory.

    Failures are one line naming the address and what was found there: ``OSError``
    when nothing could be reached (refused at once, or no answer in time), and
    ``HandshakeError`` when something answered that is not an apportion peer of
    this version (its first bytes are quoted), that does not know the secret, or
    that refused us.
    """
    key = security.key()  # no secret: say so before reaching out
    transport = transport_for(address, security, role)
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
    try:
        welcome = await asyncio.wait_for(
            _prove(
                conn, stream, address, (role, name, security.person), key, security.token_source
            ),
            max(0.0, deadline - loop.time()),
        )
    except TimeoutError:
        conn.abort()
        raise HandshakeError(
            f"{address}: no apportion handshake: no answer within {timeout:g}s"
        ) from None
    except BaseException:
        conn.abort()
        raise
    conn.max_frame = MAX_FRAME
    lender = lending.lender_in(welcome.info) if borrow else None
    if lender is not None:
        conn.borrow_from(lender)
    return conn, welcome


async def _prove(
    conn: Connection,
    stream: Stream,
    address: str,
    who: tuple[str, str, str],
    key: bytes,
    source: str,
) -> Welcome:
    """The connecting side of the handshake, up to the listener's ``Welcome``; ``who``
    is the role, name and person it connects as."""
    role, name, person = who
    ours = auth.new_nonce()
    conn.send(Hello(PROTOCOL_VERSION, role, name))
    conn.send(AuthHello(ours, person))
    try:
        reply = await _first_frame(stream)
    except _PeerGone as exc:
        raise HandshakeDropped(f"{address}: the handshake did not complete: {exc}") from None
    except _Foreign as exc:
        raise HandshakeError(
            foreign_text(
                address, exc.sample, closed=exc.closed, dashboard_of=_dashboard_of(address, exc)
            )
        ) from None
    challenge = _expect(reply, AuthChallenge, address)
    expected = auth.proof(key, auth.LISTENER, role, name, ours, challenge.nonce, person)
    if not auth.verify(expected, challenge.proof):
        if person:  # a person's credential: the cluster's secret would not help them
            raise AuthenticationError(
                f"{address} does not know the secret this side holds for {person} (from "
                f"{source}): {person} was never admitted there, was removed, or holds an "
                "old credential; ask the cluster's owner for a new one (apportion user add)"
            )
        raise AuthenticationError(
            f"{address} does not know the secret this side holds (from {source}): {HOW_TO_GIVE}"
        )
    conn.send(AuthProof(auth.proof(key, auth.CONNECTOR, role, name, ours, challenge.nonce, person)))
    try:
        final = await conn.recv()
    except ConnectionClosed as exc:
        raise HandshakeDropped(f"{address}: the handshake did not complete: {exc}") from None
    except ProtocolError as exc:
        raise HandshakeError(f"{address}: the handshake did not complete: {exc}") from None
    return _expect(final, Welcome, address)


_M = TypeVar("_M", bound=Message)


def _expect(batch: list[Message], kind: type[_M], address: str) -> _M:
    """The single message of a handshake frame, which must be ``kind``; a ``Refused``
    or a version mismatch is raised in words."""
    first = batch[0] if len(batch) == 1 else None
    if isinstance(first, Refused):
        text = f"{address} refused the connection: {first.reason}"
        if first.reason.startswith(AUTH_FAILED):
            raise AuthenticationError(f"{text}; {HOW_TO_GIVE}")
        raise HandshakeError(text)
    if isinstance(first, Welcome) and first.protocol != PROTOCOL_VERSION:
        raise HandshakeError(version_mismatch(PROTOCOL_VERSION, first.protocol, "server"))
    if not isinstance(first, kind):
        raise HandshakeError(f"{address}: no apportion handshake: the peer sent {batch!r:.200}")
    return first


#: Bytes of a non-apportion answer read to tell what it is (an HTTP head's first
#: lines fit); ``foreign_peer.QUOTED_BYTES`` of them are quoted.
SAMPLE_BYTES = 512


class _PeerGone(HandshakeError):
    """The peer went away before answering: said as such, not as a foreign peer (a
    worker that died while a peer was connecting to it is the common case)."""


class _Foreign(HandshakeError):
    """Something that is not an apportion peer answered; its first bytes."""

    def __init__(self, sample: bytes, *, closed: bool = False) -> None:
        super().__init__(f"the peer sent {sample!r:.60}")
        self.sample = sample
        #: It closed the connection after them.
        self.closed = closed


async def _first_frame(stream: Stream) -> list[Message]:
    """The reply to our ``Hello``, read raw so that a foreign answer can be named."""
    try:
        header = await stream.read_exactly(HEADER.size)
    except StreamClosed as exc:
        if not exc.partial:
            raise _PeerGone("the peer closed the connection without a word") from None
        raise _Foreign(exc.partial, closed=True) from None
    try:
        length, count = frame_sizes(header, MAX_HANDSHAKE_FRAME)
        if count:
            raise ProtocolError("a handshake carries no payload")
    except ProtocolError:
        raise _Foreign(await _sample(stream, bytes(header))) from None
    try:
        body = await stream.read_exactly(length)
    except StreamClosed as exc:
        raise _Foreign(bytes(header) + exc.partial, closed=True) from None
    try:
        return decode_body(body)
    except ProtocolError:
        raise _Foreign(bytes(header) + body[:SAMPLE_BYTES]) from None


async def _sample(stream: Stream, head: bytes) -> bytes:
    """``head`` and what follows it at once, up to ``SAMPLE_BYTES``, for an error message."""
    with contextlib.suppress(TimeoutError, ConnectionError):
        head += await asyncio.wait_for(stream.read_some(SAMPLE_BYTES - len(head)), 0.2)
    return head[:SAMPLE_BYTES]


def _dashboard_of(address: str, foreign: _Foreign) -> str | None:
    """The address of the user's scheduler whose dashboard is at ``address``, by the
    user's own scheduler files; None if none is (or the answer was not a web server's)."""
    if peer_kind(foreign.sample) not in ("HTTP", "TLS"):
        return None
    try:
        found = dashboard_owner(address, own_sightings(default_scheduler_file()))
    except OSError:
        return None
    return None if found is None else found.address


#: The key a person admitted by the owner proves (their own secret), by name; None
#: for a name nobody admitted.
PersonKeys = Callable[[str], bytes | None]

#: The roles a person may connect as: they use the cluster, they do not make it up
#: (workers and their supervisors prove the cluster's secret).
PERSON_ROLES = frozenset({"client"})


@dataclass(frozen=True, slots=True)
class Admitted:
    """A peer that completed the handshake: its ``Hello``, and whom it speaks for."""

    hello: Hello
    #: A person's name, or ``OWNER`` ("") for a peer that proved the cluster's secret.
    person: str = ""


async def accept_connection(
    conn: Connection,
    roles: set[str],
    peer_id: str,
    info: dict[str, Any],
    *,
    security: Security,
    timeout: float = HANDSHAKE_TIMEOUT,
    people: PersonKeys | None = None,
) -> Admitted:
    """Check the peer's ``Hello`` and its proof of the secret, within ``timeout`` in all;
    answer ``Welcome``, or ``Refused`` and raise ``HandshakeError``. A peer speaking
    for a person proves that person's key, as ``people`` gives it (no ``people``: no
    person is admitted here, as at a worker's data port)."""
    conn.max_frame = MAX_HANDSHAKE_FRAME
    key = security.key()
    try:
        # Not wait_for: on Python 3.11 its inner task keeps a refusal's traceback, and
        # with it the connection and its read buffer, in a cycle that only the cycle
        # collector frees; a crowd of refused peers would cost a buffer each until then.
        async with asyncio.timeout(timeout):
            admitted = await _check(conn, roles, key, people)
    except TimeoutError:
        raise HandshakeError(
            f"{conn.peer} did not complete the handshake within {timeout:g}s"
        ) from None
    conn.send(Welcome(PROTOCOL_VERSION, peer_id, info))
    conn.max_frame = MAX_FRAME
    return admitted


async def _check(
    conn: Connection, roles: set[str], key: bytes, people: PersonKeys | None
) -> Admitted:
    """The listener's side of the handshake, up to (not including) its ``Welcome``."""
    batch = await conn.recv()
    hello = batch[0] if batch else None
    start = batch[1] if len(batch) == 2 else None
    if not isinstance(hello, Hello):
        raise HandshakeError(f"{conn.peer} did not start with a handshake")
    reason = None
    if hello.protocol != PROTOCOL_VERSION:
        reason = version_mismatch(PROTOCOL_VERSION, hello.protocol, hello.role or "peer")
    elif hello.role not in roles:
        reason = f"role {hello.role!r} is not served here (expected one of {sorted(roles)})"
    elif not isinstance(start, AuthHello):
        reason = "no authentication offered"
    if reason is not None:
        await _refuse(conn, reason)
    assert isinstance(start, AuthHello)
    person = start.person
    if person:
        found = people(person) if people is not None else None
        # A name nobody admitted goes through the same steps with a key nobody knows,
        # and fails as a wrong secret does: a stranger learns nothing of who is admitted.
        key = found if found is not None else auth.new_nonce()
    ours = auth.new_nonce()
    role, name = hello.role, hello.name
    conn.send(
        AuthChallenge(ours, auth.proof(key, auth.LISTENER, role, name, start.nonce, ours, person))
    )
    answer = await conn.recv()
    proof = answer[0] if len(answer) == 1 else None
    expected = auth.proof(key, auth.CONNECTOR, role, name, start.nonce, ours, person)
    if not isinstance(proof, AuthProof) or not auth.verify(expected, proof.proof):
        await _refuse(conn, f"{AUTH_FAILED}: the peer does not know the cluster's secret")
    if person and hello.role not in PERSON_ROLES:
        # Only once proved: a stranger learns nothing of who is admitted.
        await _refuse(
            conn,
            f"{person}'s credential connects clients only: a {hello.role} needs the "
            "cluster's secret",
        )
    return Admitted(hello, person)


async def _refuse(conn: Connection, reason: str) -> NoReturn:
    conn.send(Refused(reason))
    await conn.close()
    raise HandshakeError(reason)
