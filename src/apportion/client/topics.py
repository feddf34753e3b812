"""Where messages published on a topic arrive in a client: its ``Sub`` objects.

The scheduler sends each client one copy of a message for all its subscriptions
to the topic (``scheduler/channels.py``); here the copy goes to each live ``Sub``
of that client and topic. Kept apart from ``channels.py`` so that the client's
message handler can reach it without importing the primitives.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

from apportion.core import payload
from apportion.core.payload import Pickled
from apportion.protocol.coordination import TopicMessage


class Receiver(Protocol):
    """What a subscription is to the client: something that takes messages."""

    def receive(self, blob: Pickled) -> None: ...


#: client (any object a client's messages arrive through) -> topic -> its live
#: subscriptions there.
_subscriptions: weakref.WeakKeyDictionary[object, dict[str, weakref.WeakSet[Any]]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def add(client: object, name: str, receiver: Receiver) -> None:
    """``receiver`` gets what ``client`` receives on topic ``name`` from now on."""
    with _lock:
        topics = _subscriptions.setdefault(client, {})
        topics.setdefault(name, weakref.WeakSet()).add(receiver)


def deliver(client: object, msg: TopicMessage) -> None:
    """On the client's loop: pass a published message, still pickled, to its
    subscriptions; each unpickles it on the thread that takes it (``Sub.get``):
    its class may be of a module that thread is importing meanwhile
    (``results.loads_here`` says why that must not happen here)."""
    with _lock:
        receivers = list(_subscriptions.get(client, {}).get(msg.name, ()))
    for receiver in receivers:
        receiver.receive(msg.data)


def opened(name: str, blob: Pickled) -> Any:
    """A published message unpickled, on the thread that takes it."""
    try:
        (value,), _ = payload.unpack_call(blob, {})  # packed as Pub.put's one argument
    except Exception as exc:
        raise RuntimeError(
            f"a message published on {name!r} cannot be unpickled here: {exc!r}"
        ) from exc
    return value
