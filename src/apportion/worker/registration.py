"""Registering with the scheduler: patiently at start, with backoff after losing it.

Two loops with different rules. At start only "nothing there" is retried, for
``connect_timeout`` (a worker started before its scheduler, as Dask's waits too),
by ``net/retry.py`` as a client's first connection is: a peer that answers
wrongly, or a scheduler that refuses us, will not change its mind. After losing
the scheduler every failure but a changed secret is retried, for
``reconnect_timeout``. Both wait ``FIRST_BACKOFF`` first, doubling up to
``MAX_BACKOFF``, on the worker's clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from apportion.clock import Clock
from apportion.net.connection import Connection
from apportion.net.handshake import HandshakeDropped, HandshakeError
from apportion.net.retry import FIRST_BACKOFF, MAX_BACKOFF, retry_until
from apportion.net.security import AuthenticationError

logger = logging.getLogger("apportion.worker")

#: One attempt: connect, complete the handshake and register.
Register = Callable[[], Awaitable[Connection]]


async def first_registration(
    register: Register, clock: Clock, connect_timeout: float, name: str
) -> Connection:
    """Register, retrying while nothing listens at the address, for ``connect_timeout``.

    Only "nothing there" is retried (refused, no answer), and a handshake the
    scheduler dropped unanswered (``HandshakeDropped``: its gate makes room for
    newer ones when many workers of a host connect at once).
    """

    def waiting(failure: Exception) -> None:
        # One line, not one per attempt: the worker is expected to wait here.
        logger.info("worker %s: %s; retrying for up to %gs", name, failure, connect_timeout)

    try:
        return await retry_until(
            register, _nothing_there, clock=clock, timeout=connect_timeout, waiting=waiting
        )
    except OSError as exc:
        if connect_timeout > 0 and _nothing_there(exc):
            # TimeoutError, as Dask's worker raises past its death_timeout; it is
            # an OSError, as the failures retried here are.
            raise TimeoutError(f"{exc}; gave up after {connect_timeout:g}s") from None
        raise


def _nothing_there(failure: Exception) -> bool:
    """Whether ``failure`` says no scheduler is there yet (a HandshakeError is an
    OSError too: only a dropped handshake is one of those)."""
    if isinstance(failure, HandshakeError):
        return isinstance(failure, HandshakeDropped)
    return isinstance(failure, OSError)


async def reconnect(
    register: Register, clock: Clock, reconnect_timeout: float, name: str
) -> Connection | str:
    """Register afresh with backoff: the connection, or the last failure's text."""
    deadline = clock.monotonic() + reconnect_timeout
    delay = FIRST_BACKOFF
    failure = "no attempt was made"
    while True:
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            return failure
        await clock.sleep(min(delay, remaining))
        delay = min(delay * 2, MAX_BACKOFF)
        try:
            return await asyncio.wait_for(register(), max(0.1, deadline - clock.monotonic()))
        except (OSError, HandshakeError) as exc:  # TimeoutError is an OSError
            failure = str(exc) or type(exc).__name__
            logger.debug("worker %s: reconnection attempt failed: %s", name, failure)
        except AuthenticationError as exc:
            return str(exc)  # the secret changed: trying again would fail again
