"""``retry_until``: what is retried, how often, and when the wait is said."""

from __future__ import annotations

import asyncio

import pytest

from apportion.net.retry import MAX_BACKOFF, retry_until


class InstantClock:
    """Sleeping moves the time on at once: the attempts' times are the schedule."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


class Refusing:
    """An attempt refused ``refusals`` times, then answering "connected"."""

    def __init__(self, clock: InstantClock, refusals: int = 1_000) -> None:
        self.clock = clock
        self.refusals = refusals
        self.times: list[float] = []

    async def __call__(self) -> str:
        self.times.append(self.clock.now)
        if len(self.times) <= self.refusals:
            raise ConnectionRefusedError("connection refused")
        return "connected"


def refused(failure: Exception) -> bool:
    return isinstance(failure, ConnectionRefusedError)


def test_refusals_are_tried_again_with_doubling_backoff_until_the_time_is_up() -> None:
    clock = InstantClock()
    attempt = Refusing(clock)
    said: list[tuple[float, str]] = []

    async def main() -> str:
        return await retry_until(
            attempt,
            refused,
            clock=clock,
            timeout=20,
            waiting=lambda failure: said.append((clock.now, str(failure))),
            say_after=2.0,
        )

    with pytest.raises(ConnectionRefusedError, match="connection refused"):
        asyncio.run(main())
    # 0.1 doubling, one try at 2 s to say so, at most MAX_BACKOFF apart, one at the end.
    expected = [0, 0.1, 0.3, 0.7, 1.5, 2.0, 5.2, 10.2, 15.2, 20.0]
    assert attempt.times == pytest.approx(expected)
    gaps = [b - a for a, b in zip(attempt.times, attempt.times[1:], strict=False)]
    assert max(gaps) == pytest.approx(MAX_BACKOFF)
    assert said == [(pytest.approx(2.0), "connection refused")]  # once, not per try


def test_a_peer_that_listens_in_time_is_connected_without_a_word() -> None:
    clock = InstantClock()
    attempt = Refusing(clock, refusals=3)
    said: list[Exception] = []

    async def main() -> str:
        return await retry_until(
            attempt, refused, clock=clock, timeout=20, waiting=said.append, say_after=2.0
        )

    assert asyncio.run(main()) == "connected"
    assert attempt.times == pytest.approx([0, 0.1, 0.3, 0.7])
    assert said == []


def test_a_failure_not_retried_is_raised_at_once() -> None:
    clock = InstantClock()
    tries: list[float] = []

    async def attempt() -> str:
        tries.append(clock.now)
        raise ConnectionResetError("not an apportion peer")

    async def main() -> str:
        return await retry_until(attempt, refused, clock=clock, timeout=20, waiting=print)

    with pytest.raises(ConnectionResetError, match="not an apportion peer"):
        asyncio.run(main())
    assert tries == [0]


def test_no_time_is_one_try() -> None:
    clock = InstantClock()
    attempt = Refusing(clock)
    said: list[Exception] = []

    async def main() -> str:
        return await retry_until(attempt, refused, clock=clock, timeout=0, waiting=said.append)

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(main())
    assert attempt.times == [0] and said == []


def test_with_no_delay_to_say_the_wait_is_said_at_the_first_refusal() -> None:
    clock = InstantClock()
    attempt = Refusing(clock, refusals=2)
    said: list[float] = []

    async def main() -> str:
        return await retry_until(
            attempt, refused, clock=clock, timeout=20, waiting=lambda _: said.append(clock.now)
        )

    assert asyncio.run(main()) == "connected"
    assert said == [0]
