"""Challenge-response proofs that both ends of a connection know the cluster's secret.

Each side sends a fresh random nonce; each proves itself with an HMAC of the secret
over everything said so far (a label for its side, the connecting peer's role and
name, and both nonces). So:

- the secret never crosses the wire, only HMACs of it;
- a recorded handshake is worthless: the other side's next nonce differs, so an old
  proof never matches again;
- a proof cannot be reflected back: the listener's and the connecting side's labels
  differ;
- both sides are authenticated: a process that took the scheduler's port first
  (another user of a login node) cannot pass itself off as the scheduler and feed a
  client results to unpickle.

Proofs are compared in constant time. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

#: Bytes of each side's nonce: never repeated in practice.
NONCE_BYTES = 32
#: Bytes of a proof (an HMAC-SHA256).
PROOF_BYTES = 32
#: Shortest secret accepted: a short, guessable one would let anyone who records a
#: handshake search for it offline.
MIN_SECRET = 16

#: What each side's proof is labelled with, so that neither can be replayed as the other.
LISTENER = b"apportion listener v1"
CONNECTOR = b"apportion connector v1"


class WeakSecretError(ValueError):
    """A secret too short to protect a cluster."""


def check_secret(secret: str, source: str) -> bytes:
    """``secret`` as the key of every proof; ``WeakSecretError`` naming ``source`` if
    it is too short."""
    if len(secret) < MIN_SECRET:
        raise WeakSecretError(
            f"the secret from {source} has {len(secret)} characters; at least {MIN_SECRET} "
            "are needed (make one with `apportion token --new`)"
        )
    return secret.encode()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _transcript(role: str, name: str, connector: bytes, listener: bytes, person: str) -> bytes:
    """The handshake's facts, each length-prefixed so no two transcripts run together."""
    parts = [role.encode(), name.encode(), connector, listener, person.encode()]
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def proof(
    key: bytes,
    label: bytes,
    role: str,
    name: str,
    connector: bytes,
    listener: bytes,
    person: str = "",
) -> bytes:
    """The HMAC one side sends: ``label`` says which side, then the transcript, which
    names the person the connecting side speaks for ("" for the owner), so that a
    proof made for one person is worth nothing for another."""
    transcript = _transcript(role, name, connector, listener, person)
    return hmac.digest(key, label + transcript, hashlib.sha256)


def verify(expected: bytes, received: bytes) -> bool:
    """Whether ``received`` is ``expected``, in time that does not depend on where they differ."""
    return hmac.compare_digest(expected, received)
