"""Field type checks for decoded messages, built once from each message's annotations.

msgpack guarantees only "some msgpack value": a peer could send a list where a key
belongs, and a handler would then fail half-way through a state change. Checking
the shape at the door turns that into a ``ProtocolError`` that closes only the
offending connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args, get_origin, get_type_hints

Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def checker(tp: Any) -> Check:
    """A predicate accepting exactly the msgpack values that decode into ``tp``."""
    if tp is Any:
        return lambda v: True
    if tp is int:
        return _is_int
    if tp is float:
        return _is_number
    if tp is str or tp is bytes:
        return lambda v: isinstance(v, tp)
    origin = get_origin(tp)
    if origin is list:
        (item_type,) = get_args(tp)
        item = checker(item_type)
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin is dict:
        key_type, value_type = get_args(tp)
        k, value = checker(key_type), checker(value_type)
        return lambda v: isinstance(v, dict) and all(k(a) and value(b) for a, b in v.items())
    fields = getattr(tp, "_fields", None)
    if fields is not None:  # a NamedTuple record travelling as a list
        checks = [checker(t) for t in get_type_hints(tp).values()]
        return lambda v: (
            isinstance(v, list | tuple)
            and len(v) == len(checks)
            and all(c(x) for c, x in zip(checks, v, strict=True))
        )
    raise TypeError(f"no wire check for {tp!r}")


def field_checks(cls: type[Any]) -> list[tuple[str, Check]]:
    """(name, check) for each field of a message class, in wire order."""
    hints = get_type_hints(cls)
    return [(name, checker(hints[name])) for name in cls._field_names]
