"""Client <-> scheduler: the people the cluster's owner admits, and refusals.

Only the owner (a client that proved the cluster's secret) may add, list or remove
people (``core/people.py``); a person asking is answered ``NotPermitted``, as is a
person's request for what is not theirs. Each request carries a ``request_id`` its
reply repeats.
"""

from __future__ import annotations

from typing import Any

from apportion.protocol.base import Message, message


@message(128)
class AddPerson(Message):
    """Admit person ``name``; ``quota`` in the spec syntax ("" for none)."""

    request_id: int
    name: str
    weight: float
    quota: str


@message(129)
class PersonAdded(Message):
    """The token person ``name`` connects with (``net/person_token.py``); ``error``
    ("" if none) says why nobody was added, and the token is then ""."""

    request_id: int
    name: str
    token: str
    error: str
    #: Where the scheduler keeps the people ("" if only in memory, lost on restart).
    stored: str


@message(130)
class RemovePerson(Message):
    """Remove person ``name``: their clients are disconnected and their work ends
    (docs/security.md says how)."""

    request_id: int
    name: str


@message(131)
class PersonRemoved(Message):
    """``error`` ("" if none) says why nobody was removed; ``cancelled``: how many of
    their tasks were cancelled, ``disconnected``: how many of their clients."""

    request_id: int
    name: str
    error: str
    cancelled: int
    disconnected: int


@message(132)
class ListPeople(Message):
    request_id: int


@message(133)
class PeopleListed(Message):
    """One row per person: ``name``, ``weight``, ``quota`` (text) and ``clients``
    (how many are connected as them now)."""

    request_id: int
    people: list[dict[str, Any]]


@message(134)
class NotPermitted(Message):
    """Scheduler -> client: the request ``request_id`` was refused, in one line: a
    person asked for what only the owner may do, or for another person's work."""

    request_id: int
    reason: str
