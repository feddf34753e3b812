"""Login tokens, sessions, the metrics token and the Host check: pure, no server."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from apportion.dashboard.auth import (
    TOKEN_LIFETIME,
    LoginRefused,
    Logins,
    Sessions,
    bearer_allowed,
    login_link,
    login_token,
    metrics_allowed,
    metrics_token,
)
from apportion.dashboard.origin import Origin, bind_address, check_exposure, uses_tls
from apportion.net.address import AddressError
from apportion.net.security import PlaintextRefused

KEY = b"k" * 32
NOW = 1_700_000_000.0


def nonce(i: int) -> bytes:
    return i.to_bytes(16, "big")


def refusal(logins: Logins, token: str, now: float = NOW) -> str:
    with pytest.raises(LoginRefused) as refused:
        logins.accept(token, now)
    return refused.value.why


def test_the_token_is_the_documented_layout() -> None:
    raw = base64.urlsafe_b64decode(login_token(KEY, NOW + 0.9, nonce(7)) + "==")
    minted = int(NOW).to_bytes(8, "big")
    mac = hmac.new(KEY, b"apportion-dashboard-login" + minted + nonce(7), hashlib.sha256)
    assert raw == minted + nonce(7) + mac.digest()[:16]


def test_a_token_is_accepted_once() -> None:
    logins = Logins(KEY)
    token = login_token(KEY, NOW, nonce(1))
    logins.accept(token, NOW + 5)
    assert refusal(logins, token, NOW + 6) == "used"
    logins.accept(login_token(KEY, NOW, nonce(2)), NOW + 7)  # another nonce: fine


def test_a_token_expires_after_a_day() -> None:
    logins = Logins(KEY)
    logins.accept(login_token(KEY, NOW, nonce(1)), NOW + TOKEN_LIFETIME)
    assert refusal(logins, login_token(KEY, NOW, nonce(2)), NOW + TOKEN_LIFETIME + 1) == "expired"
    # Far in the future is no better: a clock that far off is not a skew.
    assert refusal(logins, login_token(KEY, NOW + 3600, nonce(3))) == "invalid"


def test_tampered_and_foreign_tokens_are_invalid() -> None:
    logins = Logins(KEY)
    token = login_token(KEY, NOW, nonce(1))
    raw = bytearray(base64.urlsafe_b64decode(token + "=="))
    raw[3] ^= 1  # the time, changed to stay valid longer
    tampered = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    assert refusal(logins, tampered) == "invalid"
    assert refusal(logins, login_token(b"other" * 8, NOW, nonce(1))) == "invalid"
    for garbage in ["", "x", "!!!!", token + "AAAA", "é" * 10, token[:-2]]:
        assert refusal(logins, garbage) == "invalid"
    logins.accept(token, NOW)  # refusals did not use it up


def test_used_nonces_are_forgotten_once_their_tokens_expire() -> None:
    logins = Logins(KEY, lifetime=10)
    logins.accept(login_token(KEY, NOW, nonce(1)), NOW)
    logins.accept(login_token(KEY, NOW + 20, nonce(2)), NOW + 20)
    assert len(logins._used) == 1


def test_the_link_carries_the_token() -> None:
    link = login_link("http://127.0.0.1:8787/", KEY, NOW, nonce(1))
    assert link == "http://127.0.0.1:8787/login?token=" + login_token(KEY, NOW, nonce(1))


def test_sessions_are_capped_oldest_first() -> None:
    sessions = Sessions(cap=2)
    first, second, third = (sessions.open(bytes([i]) * 32) for i in range(3))
    assert not sessions.valid(first) and sessions.valid(second) and sessions.valid(third)
    assert not sessions.valid(None) and not sessions.valid("")
    with pytest.raises(ValueError):
        sessions.open(b"short")


def test_the_metrics_token_opens_metrics_as_a_session_does() -> None:
    token = metrics_token(KEY)
    assert token == hmac.new(KEY, b"apportion-metrics", hashlib.sha256).hexdigest()
    assert bearer_allowed(KEY, f"Bearer {token}") and bearer_allowed(KEY, f"bearer  {token} ")
    for wrong in [None, token, f"Basic {token}", f"Bearer {token[:-1]}", "Bearer é"]:
        assert not bearer_allowed(KEY, wrong)
    sessions = Sessions()
    session = sessions.open(b"s" * 32)
    assert metrics_allowed(KEY, sessions, session, None)
    assert not metrics_allowed(KEY, sessions, "nope", "Bearer nope")


@pytest.mark.parametrize(
    ("given", "scheduler", "expected"),
    [
        (":8787", "127.0.0.1", ("127.0.0.1", 8787)),
        ("8787", "tls://0.0.0.0", ("0.0.0.0", 8787)),
        (":0", "inproc://cluster", ("127.0.0.1", 0)),
        ("localhost:9000", "0.0.0.0", ("localhost", 9000)),
        ("[::1]:9000", "127.0.0.1", ("::1", 9000)),
    ],
)
def test_dashboard_addresses(given: str, scheduler: str, expected: tuple[str, int]) -> None:
    assert bind_address(given, scheduler) == expected


def test_bad_dashboard_addresses_say_so() -> None:
    for given in [":x", ":70000", "", "a b:1"]:
        with pytest.raises(AddressError):
            bind_address(given, "127.0.0.1")


def test_a_non_loopback_dashboard_needs_tls_or_consent() -> None:
    check_exposure("127.0.0.1", tls=False, allow_plaintext=False)
    check_exposure("0.0.0.0", tls=True, allow_plaintext=False)
    check_exposure("0.0.0.0", tls=False, allow_plaintext=True)
    with pytest.raises(PlaintextRefused, match="without TLS"):
        check_exposure("0.0.0.0", tls=False, allow_plaintext=False)
    assert uses_tls("10.0.0.1", True) and not uses_tls("127.0.0.1", True)


def test_only_the_dashboards_names_pass_the_host_check() -> None:
    loopback = Origin("127.0.0.1", 8787, False, "127.0.0.1")
    assert loopback.url == "http://127.0.0.1:8787"
    for good in ["127.0.0.1:8787", "localhost:8787", "[::1]:8787", "LOCALHOST.:8787"]:
        assert loopback.host_allowed(good), good
    for bad in [
        "evil.example:8787",
        "127.0.0.1:8788",
        "127.0.0.1",
        "",
        "[::1",
        "a:b",
        "10.0.0.1:8787",
    ]:
        assert not loopback.host_allowed(bad), bad
    everywhere = Origin("0.0.0.0", 443, True, "node1")
    assert everywhere.url == "https://node1:443"
    assert everywhere.host_allowed("node1") and everywhere.host_allowed("10.1.2.3:443")
    assert everywhere.host_allowed("node1.cluster:443", frozenset({"node1.cluster"}))
    assert not everywhere.host_allowed("evil.example:443")
