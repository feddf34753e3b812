"""Who may see the dashboard: one-time login links, sessions, and the metrics token.
Pure: the key, the time and the random bytes are given.

Whoever holds the cluster's secret (``Security.key()``) may open the dashboard, as
whoever holds it may connect a client. A browser cannot prove it holds the secret,
so a process that holds it (the scheduler at start, ``client.dashboard_link``)
mints a *login token*: the time, a random nonce and an HMAC of both under the
key. The dashboard accepts each token once, for ``TOKEN_LIFETIME`` seconds, and
answers it with a session cookie; the cookie, random and kept in memory only, is
what the browser shows from then on.

Token: urlsafe base64 (unpadded) of ``mint time`` (8 bytes, big-endian whole
seconds) + ``nonce`` (16 bytes) + the first 16 bytes of
``HMAC-SHA256(key, LOGIN_CONTEXT + mint time + nonce)``.

Metrics scrapers cannot log in either: they show ``Authorization: Bearer <t>``
where ``t = metrics_token(key)``, fixed for a given secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections import OrderedDict
from urllib.parse import quote

#: What a login token's MAC is about, so that no other HMAC under the key is one.
LOGIN_CONTEXT = b"apportion-dashboard-login"
#: What the metrics token is the HMAC of.
METRICS_CONTEXT = b"apportion-metrics"
#: Seconds a login token stays valid after it was minted.
TOKEN_LIFETIME = 24 * 3600.0
#: Seconds a token may seem minted in the future: the clocks of the minting client
#: and of the scheduler may disagree that much.
CLOCK_SKEW = 300.0
NONCE_BYTES = 16
MAC_BYTES = 16
_TIME_BYTES = 8
_TOKEN_BYTES = _TIME_BYTES + NONCE_BYTES + MAC_BYTES
#: Random bytes in a session id.
SESSION_BYTES = 32
#: Sessions kept at most; past this the oldest is dropped (its browser logs in again).
MAX_SESSIONS = 1000

#: How to get a fresh link, said wherever a login is refused or missing.
HOW_TO_LOG_IN = (
    "open the link the scheduler printed when it started, or get a fresh one with "
    "client.dashboard_link (Python) or apportion status --link; each link works once"
)


def login_token(key: bytes, now: float, nonce: bytes) -> str:
    """A login token minted at ``now`` (epoch seconds) with ``nonce`` (16 random bytes)."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a login nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
    minted = int(now).to_bytes(_TIME_BYTES, "big")
    raw = minted + nonce + _mac(key, minted, nonce)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def login_link(base_url: str, key: bytes, now: float, nonce: bytes) -> str:
    """``<base_url>/login?token=...``: what a user opens to log in once."""
    return f"{base_url.rstrip('/')}/login?token={quote(login_token(key, now, nonce))}"


def _mac(key: bytes, minted: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, LOGIN_CONTEXT + minted + nonce, hashlib.sha256).digest()[:MAC_BYTES]


class LoginRefused(Exception):
    """A login token that is not accepted; ``why`` is ``invalid``, ``expired`` or ``used``."""

    def __init__(self, why: str) -> None:
        super().__init__(f"the login link is {why}")
        self.why = why


class Logins:
    """Accepts each valid login token once (see the module).

    The nonces of accepted tokens are remembered until their tokens expire, so the
    memory held is bounded by the logins of the last ``TOKEN_LIFETIME`` seconds, and
    only holders of the key can add to it.
    """

    def __init__(self, key: bytes, lifetime: float = TOKEN_LIFETIME) -> None:
        self._key = key
        self.lifetime = lifetime
        #: Nonce of each accepted token -> when that token expires (epoch seconds).
        self._used: dict[bytes, float] = {}

    def accept(self, token: str, now: float) -> None:
        """Accept ``token`` at ``now`` (epoch seconds), or raise ``LoginRefused``."""
        raw = _decode(token)
        minted_bytes = raw[:_TIME_BYTES]
        nonce = raw[_TIME_BYTES : _TIME_BYTES + NONCE_BYTES]
        mac = raw[_TIME_BYTES + NONCE_BYTES :]
        if not hmac.compare_digest(mac, _mac(self._key, minted_bytes, nonce)):
            raise LoginRefused("invalid")
        minted = int.from_bytes(minted_bytes, "big")
        if now - minted > self.lifetime:
            raise LoginRefused("expired")
        if minted - now > CLOCK_SKEW:
            raise LoginRefused("invalid")
        self._forget_expired(now)
        if nonce in self._used:
            raise LoginRefused("used")
        self._used[nonce] = minted + self.lifetime

    def _forget_expired(self, now: float) -> None:
        gone = [nonce for nonce, expiry in self._used.items() if expiry < now]
        for nonce in gone:
            del self._used[nonce]


def _decode(token: str) -> bytes:
    """The token's bytes, or ``LoginRefused("invalid")``."""
    if not token.isascii() or len(token) > 2 * _TOKEN_BYTES:
        raise LoginRefused("invalid")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise LoginRefused("invalid") from None
    if len(raw) != _TOKEN_BYTES:
        raise LoginRefused("invalid")
    return raw


class Sessions:
    """The logged-in browsers: session ids, newest last, at most ``cap`` of them."""

    def __init__(self, cap: int = MAX_SESSIONS) -> None:
        self.cap = cap
        self._ids: OrderedDict[str, None] = OrderedDict()

    def open(self, random_bytes: bytes) -> str:
        """A new session's id, made from ``random_bytes`` (``SESSION_BYTES`` of them)."""
        if len(random_bytes) < SESSION_BYTES:
            raise ValueError(f"a session id needs {SESSION_BYTES} random bytes")
        session = base64.urlsafe_b64encode(random_bytes).rstrip(b"=").decode("ascii")
        self._ids[session] = None
        while len(self._ids) > self.cap:
            self._ids.popitem(last=False)
        return session

    def valid(self, session: str | None) -> bool:
        """Whether ``session`` is a live session's id."""
        return session is not None and session in self._ids

    def __len__(self) -> int:
        return len(self._ids)


def metrics_token(key: bytes) -> str:
    """The bearer token ``/metrics`` accepts: hex of HMAC-SHA256(key, METRICS_CONTEXT)."""
    return hmac.new(key, METRICS_CONTEXT, hashlib.sha256).hexdigest()


def bearer_allowed(key: bytes, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <metrics_token(key)>``."""
    if authorization is None:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = credentials.strip().encode("utf-8", "replace")
    return hmac.compare_digest(given, metrics_token(key).encode("ascii"))


def metrics_allowed(
    key: bytes, sessions: Sessions, session: str | None, authorization: str | None
) -> bool:
    """What ``/metrics`` checks: a live session's cookie, or the metrics bearer token."""
    return sessions.valid(session) or bearer_allowed(key, authorization)
