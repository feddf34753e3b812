"""Trying again, with backoff, to reach a peer that is not there yet.

A worker or a client started before its scheduler (a job script that starts
``apportion scheduler`` in the background and connects at once) finds nothing
listening for a moment. Each caller says which failures mean "not there yet"
(the worker's registration, ``worker/registration.py``; the client's connection,
``client/session.py``) and what to say while waiting; everything else, a peer
that answers wrongly or refuses us, is raised at once: it will not change its
mind. Attempts are ``FIRST_BACKOFF`` apart, doubling up to ``MAX_BACKOFF``, on
the caller's clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from apportion.clock import Clock

#: Attempts start this long after a failure and double up to ``MAX_BACKOFF``.
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0

T = TypeVar("T")


async def retry_until(
    attempt: Callable[[], Awaitable[T]],
    retried: Callable[[Exception], bool],
    *,
    clock: Clock,
    timeout: float,
    waiting: Callable[[Exception], None],
    say_after: float = 0.0,
) -> T:
    """What ``attempt`` gives, trying again after each failure that is ``retried``
    until ``timeout`` seconds of ``clock`` have passed since the first try.

    ``waiting`` is called once, with the failure, when attempts still fail
    ``say_after`` seconds after the first (at once with 0): the caller says, in one
    line rather than one per attempt, that it is waiting. A failure not retried is
    raised at once, and the last retried one as is when the time is up: the caller,
    which knows which failures it retries, words the giving up.
    """
    start = clock.monotonic()
    delay = FIRST_BACKOFF
    said = False
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not retried(exc):
                raise
            failure = exc
        now = clock.monotonic()
        remaining = start + timeout - now
        if remaining <= 0:
            raise failure
        if not said and now - start >= say_after:
            waiting(failure)
            said = True
        pause = min(delay, remaining)
        if not said and now + pause > start + say_after:
            pause = start + say_after - now  # try once more then, and say so if it fails
        await clock.sleep(pause)
        delay = min(delay * 2, MAX_BACKOFF)
