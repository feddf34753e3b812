"""Data ports: results fetched and stored directly, and actor calls.

A worker's data port answers the scheduler (relays, copies), its peers (a task's
inputs) and clients that fetch or scatter directly (``direct_to_workers``): the
same ``GetData``/``DataReply`` and ``PutData``/``DataStored`` to everyone. Actor
calls reach the worker holding the actor the same way.
"""

from __future__ import annotations

from apportion.core.payload import Pickled
from apportion.protocol.base import Message, message


@message(40)
class GetData(Message):
    """Ask a worker for results (scheduler relay, a peer or a direct client)."""

    request_id: int
    keys: list[str]
    #: Answer in several ``DataReply`` frames: the small values (and the keys missing)
    #: first, then each large value in a frame of its own, so that the asker can use
    #: each as it arrives. A peer asks so; the key sets of the parts add up to ``keys``.
    in_parts: bool = False


@message(33)
class DataReply(Message):
    """Answer to ``GetData``, from a worker to whoever asked (scheduler, peer, client)."""

    request_id: int
    data: dict[str, Pickled]
    missing: list[str]
    errors: dict[str, str]  #: held, but the value cannot be sent: key -> why


@message(41)
class PutData(Message):
    """Store data scattered by a client."""

    request_id: int
    data: dict[str, Pickled]


#: ``PutData`` request id a worker uses towards the scheduler for data a client put
#: on its data port directly; the client itself reports it with ``ScatterPlaced``.
DIRECT_PUT = -1


@message(34)
class DataStored(Message):
    """Answer to ``PutData``: the worker holds these keys now."""

    request_id: int
    keys: list[str]
    nbytes: dict[str, int]


@message(107)
class ActorCall(Message):
    """Client or task -> worker data port: call ``name`` on the actor of ``key`` with
    the pickled ``(args, kwargs)``, or, with ``attribute``, read that attribute."""

    request_id: int
    key: str
    name: str
    args: Pickled
    attribute: bool


@message(108)
class ActorReply(Message):
    """Worker data port -> caller: the pickled value, or (``exception`` not empty) the
    pickled exception and traceback the call raised."""

    request_id: int
    value: Pickled
    exception: Pickled
    traceback: Pickled
