"""What tasks ``print`` and ``warn`` (``worker/printing.py``), shown by every client.

Each client subscribes to Dask's two topics as it connects, as Dask's clients do,
and waits for the scheduler's answer, so nothing a task prints after the client is
made can miss it. Messages arrive on the client's loop through its topic
subscriptions (``topics.py``), ahead of the outcome of the task that printed them.

What arrives is shown, never raised: a message that cannot be shown (a hand-made
one of the wrong shape, a warning the client's filters turn into an error) is
logged, and the client carries on.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import sys
import warnings
from typing import Any

from apportion.client import topics
from apportion.client.session import Session
from apportion.core.payload import Pickled
from apportion.protocol.coordination import Subscribe
from apportion.worker.printing import PRINT_TOPIC, STDERR, STDOUT, WARN_TOPIC

logger = logging.getLogger("apportion.client")


def show_print(message: Any) -> None:
    """Print what a task printed: its texts, ``sep``, ``end``, to stdout or stderr."""
    if not isinstance(message, dict):
        builtins.print(message)  # published by hand on the topic: shown as it is
        return
    args = message.get("args", ())
    if not isinstance(args, tuple):
        raise TypeError(f"a print message's args must be a tuple, not {args!r}")
    where = message.get("file")
    if where not in (None, STDOUT, STDERR):
        raise TypeError(f"a print message's file must be {STDOUT} or {STDERR}, not {where!r}")
    stream = sys.stderr if where == STDERR else sys.stdout
    builtins.print(
        *args,
        sep=message.get("sep"),
        end=message.get("end"),
        file=stream,
        flush=bool(message.get("flush")),
    )


def show_warning(message: Any) -> None:
    """Emit the warning a task emitted, under this process's warning filters."""
    if not isinstance(message, dict):
        warnings.warn(str(message), stacklevel=2)
        return
    if "message" not in message:
        raise TypeError("a warn message has no 'message'")
    category = message.get("category") or UserWarning
    warnings.warn(message["message"], category, stacklevel=2)


class _Shown:
    """A subscription that shows each message with ``show``, logging what it cannot."""

    def __init__(self, topic: str, show: Any) -> None:
        self.topic = topic
        self.show = show

    def receive(self, blob: Pickled) -> None:
        # Unpickled on the client's loop, unlike other topics' messages: a worker
        # sends printed text as strings and a warning's category as a class, which
        # are seldom of a module the user's thread is importing meanwhile.
        try:
            self.show(topics.opened(self.topic, blob))
        except Exception:
            logger.exception("a message a task sent on %r cannot be shown", self.topic)


#: Held here for good: a client's subscriptions are weak references (``topics.py``).
_SHOWN = (_Shown(PRINT_TOPIC, show_print), _Shown(WARN_TOPIC, show_warning))


async def subscribe(client: object, session: Session) -> None:
    """On ``session``'s loop: show what tasks print and warn on ``client`` from now on."""
    for shown in _SHOWN:
        topics.add(client, shown.topic, shown)
    await asyncio.gather(
        *(session.request(Subscribe(session.next_id(), shown.topic)) for shown in _SHOWN)
    )
