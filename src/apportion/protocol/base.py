"""What every wire message is: ``Message``, its tag, the registry the codec decodes by.

The messages themselves live by conversation: ``handshake``, ``tasks``, ``cluster``,
``shared_data``, ``coordination``, ``remote_calls``, ``services``, ``worker`` and
``peer_data`` beside this module, and the job queue's in ``runs/messages.py``. Each
states its tag (``@message(17)``), so moving a class changes nothing on the wire.

On the wire a message is a msgpack array ``[tag, field, field, ...]`` in field order;
a frame carries a list of them (everything one peer had to say in one loop turn).
Fields are msgpack primitives only: ``str``, ``int``, ``float``, ``bytes``, lists and
dicts of those, and ``Pickled`` values. Payloads produced by user code (pickled
arguments, results, exceptions) are ``Pickled``: ``bytes`` when small, a ``Payload``
of frames sent out of band when large (``protocol/codec.py``); the scheduler forwards
them without unpickling. Pickled functions and code stay ``bytes``.

Resource amounts travel in fixed-point ticks (see ``apportion.core.resources``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform

from apportion.protocol.homes import HOME_OF

#: Bumped whenever a message changes shape. Peers with another version are refused
#: in the handshake, naming both versions, instead of failing later on a bad field.
PROTOCOL_VERSION = 20


class Message:
    """Base of every wire message; ``@message(tag)`` gives each subclass its ``TAG``."""

    __slots__ = ()
    TAG: ClassVar[int]
    _field_names: ClassVar[tuple[str, ...]]
    #: The fields' values in order (one C call, not a loop: every message sent pays it).
    _values: ClassVar[Callable[[Message], tuple[Any, ...]]]

    def to_wire(self) -> list[Any]:
        """``[tag, *fields]``, ready for msgpack."""
        return [self.TAG, *type(self)._values(self)]

    def __repr__(self) -> str:
        values = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._field_names)
        return f"{type(self).__qualname__}({values})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        values = type(self)._values
        return values(self) == values(other)

    def __hash__(self) -> int:
        return hash((self.TAG, *type(self)._values(self)))

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        """Build from decoded fields; messages with nested records override this."""
        return cls(*values)


_REGISTRY: dict[int, type[Message]] = {}
#: Class name -> class: a service registers for requests by class name
#: (``RegisterService``), so a name stands for one message only.
_BY_NAME: dict[str, type[Message]] = {}

_M = TypeVar("_M", bound=type[Message])


@dataclass_transform(frozen_default=True)
def message(tag: int) -> Callable[[_M], _M]:
    """Decorator: a frozen, slotted dataclass registered as the wire message ``tag``.

    Each message states its tag, so that moving a class to another module changes
    nothing on the wire; a tag or a name taken twice fails at import, before any
    peer could be misread. A message that changes shape bumps ``PROTOCOL_VERSION``.
    """
    if type(tag) is not int or tag < 1:
        raise TypeError(f"a message tag is a positive int, not {tag!r}")

    def register(cls: _M) -> _M:
        taken = _REGISTRY.get(tag)
        if taken is not None:
            raise ValueError(f"message tag {tag} of {cls.__name__} is taken by {taken.__name__}")
        if cls.__name__ in _BY_NAME:
            raise ValueError(f"two messages are named {cls.__name__}")
        dc: Any = dataclass(frozen=True, slots=True, repr=False, eq=False)(cls)
        dc.TAG = tag
        dc._field_names = tuple(f.name for f in fields(dc))
        dc._values = staticmethod(_values_getter(dc._field_names))
        _REGISTRY[tag] = _BY_NAME[dc.__name__] = dc
        return cast(_M, dc)

    return register


def _values_getter(names: tuple[str, ...]) -> Callable[[Message], tuple[Any, ...]]:
    """A function giving the values of ``names`` of a message, as a tuple."""
    if len(names) >= 2:
        return cast(Callable[[Message], tuple[Any, ...]], attrgetter(*names))
    if names:
        one = attrgetter(names[0])
        return lambda m: (one(m),)
    return lambda m: ()


def message_class(tag: int) -> type[Message] | None:
    """The message class for ``tag``, or None if no such message exists; the module
    defining it is imported the first time its tag is asked for (``homes.py``)."""
    cls = _REGISTRY.get(tag)
    if cls is None:
        home = HOME_OF.get(tag)
        if home is not None:
            importlib.import_module(home)
            cls = _REGISTRY.get(tag)
    return cls


def registered() -> dict[int, type[Message]]:
    """Every message registered so far, by tag (the modules defining them imported)."""
    return dict(_REGISTRY)
