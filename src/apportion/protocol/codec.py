"""Frames: a header, a msgpack list of messages, then the payloads' buffers.

A frame is ``!QI`` (the body's length, the number of out-of-band buffers), one
``!Q`` length per buffer, the msgpack body, then the buffers themselves. A
``Payload`` inside a message (a pickled value, ``core/payload.py``) is written into
the body as a msgpack extension naming its frames' place among the buffers; its
frames go after the body as they are, so a NumPy array is sent from its own memory
and received into a buffer of its own. Lengths are 64-bit, and the receiver checks
them against its limits (``MAX_BODY``, ``MAX_BUFFERS``, ``MAX_FRAME``; a far smaller
``MAX_HANDSHAKE_FRAME`` before the handshake) before it allocates anything of the
announced size: a header of garbage costs a ``ProtocolError``, not memory.

A tag's message class is loaded with its module the first time the tag arrives
(``protocol/homes.py``), so that whatever decodes knows every tag while a process
imports only the conversations it takes part in.

Pure: bytes in, messages out. Anything that does not decode into known messages
with the right number of fields is a ``ProtocolError``; the connection that sent it
is closed and nothing else is affected.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from apportion.core.payload import Payload
from apportion.protocol.base import Message, message_class
from apportion.protocol.validate import Check, field_checks

#: A frame's pieces: anything with the buffer protocol, one byte per item.
Buffer = bytes | bytearray | memoryview

#: A frame's fixed header: the body's length, then how many buffers follow it.
HEADER = struct.Struct("!QI")
#: One buffer's length, as many as the header announces, between header and body.
BUFFER_LENGTH = struct.Struct("!Q")
#: Set in a buffer's listed length when the buffer is lent (``net/lending.py``): the
#: frame carries where it lies in the sender's memory instead of its bytes.
LENT = 1 << 63
#: What a lent buffer's place in the frame holds: its address in the sender.
LENT_PLACE = struct.Struct("!Q")
#: The msgpack extension type of a payload: its first buffer's index, and how many.
PAYLOAD_EXT = 1
_PAYLOAD_PLACE = struct.Struct("!II")

#: Largest msgpack body of one frame accepted from an authenticated peer. The body
#: is read whole and decoded at once, so it is bounded well below ``MAX_FRAME``; a
#: graph of a million tasks takes a few hundred MiB.
MAX_BODY = 1 << 30
#: Most buffers one frame may list: a million task results in one frame, while a
#: header cannot make us allocate a list of 2**32 lengths.
MAX_BUFFERS = 1_000_000
#: Largest frame in all (body, buffer lengths and buffers) accepted from an
#: authenticated peer. Values are as large as memory, so it is large; but finite,
#: so that a header of garbage is refused instead of tried.
MAX_FRAME = 64 << 30

#: Largest frame accepted before the handshake: a Hello is a few dozen bytes, so
#: an unauthenticated peer cannot make us allocate more than this.
MAX_HANDSHAKE_FRAME = 64 * 1024


_CHECKS: dict[type[Message], list[tuple[str, Check]]] = {}


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame of this protocol."""


#: Decides whether to lend one buffer: its address in this process, or None to send it.
Lend = Callable[[Buffer, int], int | None]


def encode_frame(messages: Sequence[Message], lend: Lend | None = None) -> list[Buffer]:
    """One frame carrying ``messages`` in order: the header and body as one ``bytes``,
    then every payload's frames as they are (not copied). ``lend`` is asked about each
    of them (with its length): where it answers an address, the frame carries that
    address instead of the bytes."""
    wire = [m.to_wire() for m in messages]
    try:  # most frames carry no payload: no hook to call
        body: bytes = msgpack.packb(wire, use_bin_type=True)
    except TypeError:
        pass
    else:
        return [HEADER.pack(len(body), 0) + body]
    buffers: list[bytes | bytearray | memoryview] = []

    def place(obj: object) -> Any:
        if isinstance(obj, Payload):
            first = len(buffers)
            buffers.extend(obj.frames)
            return msgpack.ExtType(PAYLOAD_EXT, _PAYLOAD_PLACE.pack(first, len(obj.frames)))
        raise TypeError(f"cannot send a {type(obj).__name__} in a message")

    body = msgpack.packb(wire, use_bin_type=True, default=place)
    listed: list[bytes] = []
    out: list[Buffer] = []
    for buffer in buffers:
        size = memoryview(buffer).nbytes
        address = None if lend is None else lend(buffer, size)
        if address is None:
            listed.append(BUFFER_LENGTH.pack(size))
            out.append(buffer)
        else:
            listed.append(BUFFER_LENGTH.pack(size | LENT))
            out.append(LENT_PLACE.pack(address))
    return [HEADER.pack(len(body), len(buffers)) + b"".join(listed) + body, *out]


def frame_sizes(
    header: bytes | bytearray | memoryview,
    limit: int = MAX_FRAME,
    *,
    max_body: int = MAX_BODY,
    max_buffers: int = MAX_BUFFERS,
) -> tuple[int, int]:
    """(body length, number of buffers) announced by ``header``; refuses a frame whose
    body passes ``max_body``, that lists more than ``max_buffers`` buffers, or whose
    body and buffer lengths alone pass ``limit``. Checked before anything of the
    announced size is read or allocated."""
    if len(header) != HEADER.size:
        raise ProtocolError(f"frame header of {len(header)} bytes, expected {HEADER.size}")
    body, count = HEADER.unpack(header)
    if body > max_body:
        raise ProtocolError(
            f"frame body of {body} bytes exceeds the limit of {max_body} for a body"
        )
    if count > max_buffers:
        raise ProtocolError(f"frame of {count} buffers exceeds the limit of {max_buffers} buffers")
    if body + count * BUFFER_LENGTH.size > limit:
        raise ProtocolError(
            f"frame of {body + count * BUFFER_LENGTH.size} bytes before its buffers "
            f"exceeds the limit of {limit} for a whole frame"
        )
    return int(body), int(count)


def buffer_lengths(
    data: bytes | bytearray | memoryview, count: int, body: int, limit: int = MAX_FRAME
) -> tuple[list[int], tuple[int, ...]]:
    """The ``count`` buffer lengths in ``data``, and the indices of the lent buffers
    among them; refuses a frame passing ``limit`` in all (body, lengths and buffers,
    lent ones included: they are received into buffers of their own too)."""
    if len(data) != count * BUFFER_LENGTH.size:
        raise ProtocolError(
            f"frame announces {count} buffers but lists {len(data) / BUFFER_LENGTH.size:g}"
        )
    lengths = [length for (length,) in BUFFER_LENGTH.iter_unpack(data)]
    lent = tuple(i for i, length in enumerate(lengths) if length & LENT)
    for i in lent:
        lengths[i] &= ~LENT
    total = body + len(data) + sum(lengths)
    if total > limit:
        raise ProtocolError(
            f"frame of {total} bytes exceeds the limit of {limit} for a whole frame"
        )
    return lengths, lent


def decode_frame(data: bytes | bytearray | memoryview, limit: int = MAX_FRAME) -> list[Message]:
    """The messages of one whole frame held in ``data`` (its buffers as views of it)."""
    view = memoryview(data).cast("B")
    body_size, count = frame_sizes(view[: HEADER.size], limit)
    at = HEADER.size + count * BUFFER_LENGTH.size
    lengths, lent = buffer_lengths(view[HEADER.size : at], count, body_size, limit)
    if lent:
        raise ProtocolError("a whole frame cannot hold lent buffers")
    body, at = view[at : at + body_size], at + body_size
    buffers = []
    for length in lengths:
        buffers.append(view[at : at + length])
        at += length
    if at != len(view):
        raise ProtocolError(f"frame of {at} bytes followed by {len(view) - at} more")
    return decode_body(bytes(body), buffers)


def decode_body(
    body: bytes | bytearray, buffers: Sequence[bytes | bytearray | memoryview] = ()
) -> list[Message]:
    """Messages from a frame body, with the frame's out-of-band ``buffers``."""
    raw = _unpack(body, buffers)
    if not isinstance(raw, list):
        raise ProtocolError("frame must hold a list of messages")
    return [_message(item) for item in raw]


def _unpack(body: bytes | bytearray, buffers: Sequence[bytes | bytearray | memoryview]) -> Any:
    if not buffers:  # most frames: a payload extension here is refused by the field checks
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"frame is not valid msgpack: {exc}") from None

    def payload(code: int, data: bytes) -> Payload:
        if code != PAYLOAD_EXT or len(data) != _PAYLOAD_PLACE.size:
            raise ProtocolError(f"unknown msgpack extension {code}")
        first, count = _PAYLOAD_PLACE.unpack(data)
        if count < 1 or first + count > len(buffers):
            raise ProtocolError(
                f"a payload names buffers {first}..{first + count - 1} of {len(buffers)}"
            )
        return Payload(buffers[first : first + count])

    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=payload)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from None


def _message(item: Any) -> Message:
    """One decoded ``[tag, *fields]`` as its message, every field's type checked."""
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
        return cls.from_fields(fields)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {cls.__name__}: {exc}") from None


def encode_message(message: Message) -> bytes:
    """One message as bytes another message can carry (a ``TaskNote``'s note); it must
    carry no payload."""
    head, *buffers = encode_frame([message])
    if buffers or not isinstance(head, bytes):
        raise ValueError(f"{type(message).__name__} carries a payload and cannot be embedded")
    return head[HEADER.size :]


def decode_message(data: bytes) -> Message:
    """The message ``encode_message`` made; ``ProtocolError`` if it is not exactly one."""
    messages = decode_body(data)
    if len(messages) != 1:
        raise ProtocolError(f"expected one encoded message, got {len(messages)}")
    return messages[0]
