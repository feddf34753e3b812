"""Frames: a 4-byte big-endian length, then a msgpack list of messages.

Pure: bytes in, messages out. Anything that does not decode into known messages
with the right number of fields is a ``ProtocolError``; the connection that sent it
is closed and nothing else is affected.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack

from apportion.protocol.messages import Message, message_class
from apportion.protocol.validate import Check, field_checks

HEADER = struct.Struct("!I")

#: Largest frame accepted from an authenticated peer (results can be large).
MAX_FRAME = 2**31 - 1

#: Largest frame accepted before the handshake: a Hello is a few dozen bytes, so
#: an unauthenticated peer cannot make us allocate more than this.
MAX_HANDSHAKE_FRAME = 64 * 1024


_CHECKS: dict[type[Message], list[tuple[str, Check]]] = {}


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame of this protocol."""


def encode_frame(messages: Sequence[Message]) -> bytes:
    """One frame carrying ``messages`` in order."""
    body: bytes = msgpack.packb([m.to_wire() for m in messages], use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body):,} bytes exceeds the limit of {MAX_FRAME:,}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> list[Message]:
    """Messages from a frame body (the bytes after the length header)."""
    try:
        raw: Any = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from None
    if not isinstance(raw, list):
        raise ProtocolError("frame must hold a list of messages")
    out: list[Message] = []
    for item in raw:
        if not isinstance(item, list) or not item or not isinstance(item[0], int):
            raise ProtocolError("each message must be [tag, fields...]")
        cls = message_class(item[0])
        if cls is None:
            raise ProtocolError(f"unknown message tag {item[0]}")
        if len(item) - 1 != len(cls._field_names):
            raise ProtocolError(
                f"{cls.__name__} takes {len(cls._field_names)} fields, got {len(item) - 1}"
            )
        checks = _CHECKS.get(cls)
        if checks is None:
            checks = _CHECKS[cls] = field_checks(cls)
        fields = item[1:]
        for (name, check), value in zip(checks, fields, strict=True):
            if not check(value):
                raise ProtocolError(f"{cls.__name__}.{name} has the wrong type")
        try:
            out.append(cls.from_fields(fields))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed {cls.__name__}: {exc}") from None
    return out


def encode_message(message: Message) -> bytes:
    """One message as bytes another message can carry (a ``TaskNote``'s note)."""
    return encode_frame([message])[HEADER.size :]


def decode_message(data: bytes) -> Message:
    """The message ``encode_message`` made; ``ProtocolError`` if it is not exactly one."""
    messages = decode_body(data)
    if len(messages) != 1:
        raise ProtocolError(f"expected one encoded message, got {len(messages)}")
    return messages[0]


def frame_length(header: bytes, limit: int) -> int:
    """Body length announced by ``header``; refuses frames above ``limit``."""
    (length,) = HEADER.unpack(header)
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {limit}")
    return int(length)
