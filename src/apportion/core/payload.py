"""How functions, arguments and results become bytes, and back.

Dependencies need no walk over the arguments: a ``Future`` (or a key reference
from an old-style graph) pickles as a call to ``_input(key)``. On the client,
``pack_call`` records every key pickled that way, which gives the task's
dependencies. On the worker, ``unpack_call`` unpickles with the task's input
values in scope, so each placeholder turns straight into its value wherever it
sits, nested in lists, dicts or objects. Pickling stays in C for plain data.

Values are pickled with protocol 5 and their large buffers *out of band*: a NumPy
array, a pandas column, a ``bytearray`` or a large ``bytes`` is not copied into the
pickle stream but kept as a buffer of its own, sent from its own memory and received
into the buffer the value then lives in (``Payload``). Small values stay one
``bytes`` object, as cheap on the wire as before.

The scheduler never calls anything here: it forwards these payloads unopened.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import cloudpickle

#: Buffers smaller than this stay inside the pickle stream: a frame of their own
#: would cost more than the copy.
OUT_OF_BAND_MIN = 64 * 1024
#: Pickle streams larger than this travel as a buffer of their own too, so that a
#: large in-band value (a long list) is not copied into the message around it.
INLINE_MAX = 64 * 1024


class Payload:
    """A pickled value as frames: the pickle stream, then its out-of-band buffers.

    Frames are whatever holds the bytes (``bytes``, ``bytearray``, a ``memoryview``
    of a NumPy array's memory); the codec sends each as it is and the receiver gets
    each in a ``bytearray`` of its own.
    """

    __slots__ = ("frames",)

    def __init__(self, frames: Sequence[bytes | bytearray | memoryview]) -> None:
        if not frames:
            raise ValueError("a payload has at least its pickle stream")
        self.frames = tuple(frames)

    @property
    def nbytes(self) -> int:
        """Bytes in all frames."""
        return sum(memoryview(frame).nbytes for frame in self.frames)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Payload):
            return NotImplemented
        return len(self.frames) == len(other.frames) and all(
            memoryview(a).cast("B") == memoryview(b).cast("B")
            for a, b in zip(self.frames, other.frames, strict=True)
        )

    def __hash__(self) -> int:
        return hash(bytes(memoryview(self.frames[0]).cast("B")))

    def __repr__(self) -> str:
        return f"<Payload {len(self.frames)} frames, {self.nbytes:,} bytes>"


#: What a pickled value travels as: one ``bytes`` when small and self-contained,
#: otherwise a ``Payload`` of frames.
Pickled = bytes | Payload


def size_of(pickled: Pickled) -> int:
    """Bytes a pickled value occupies on the wire."""
    return len(pickled) if isinstance(pickled, bytes) else pickled.nbytes


def hash_into(digest: Any, pickled: Pickled) -> Any:
    """Feed ``pickled``'s bytes to a ``hashlib`` object (frame by frame); return it."""
    for frame in (pickled,) if isinstance(pickled, bytes) else pickled.frames:
        digest.update(frame)
    return digest


#: The keys ``pack_call`` is collecting on this thread (None outside it). Context
#: variables, not module globals: each thread (and task) sees only its own.
_collected: ContextVar[set[str] | None] = ContextVar("apportion_collected", default=None)
#: The input values placeholders unpickle as, inside ``task_inputs`` (None outside).
_inputs: ContextVar[Mapping[str, Any] | None] = ContextVar("apportion_inputs", default=None)


class MissingInputError(RuntimeError):
    """A task argument refers to a key whose value was not supplied."""


def _input(key: str) -> Any:
    """Placeholder target: the value of ``key`` for the task being unpacked."""
    inputs = _inputs.get()
    if inputs is None:
        raise MissingInputError(f"a reference to {key!r} was unpickled outside a task")
    try:
        return inputs[key]
    except KeyError:
        raise MissingInputError(f"input {key!r} is not available to this task") from None


def reduce_reference(key: str) -> tuple[Callable[[str], Any], tuple[str]]:
    """``__reduce__`` for anything that stands for the result of ``key``.

    While ``pack_call`` runs on this thread, the key is recorded as a dependency.
    """
    collected = _collected.get()
    if collected is not None:
        collected.add(key)
    return _input, (key,)


class KeyRef:
    """A reference to another key's result, as old-style graphs write them (``"x"``)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __reduce__(self) -> tuple[Callable[[str], Any], tuple[str]]:
        return reduce_reference(self.key)

    def __repr__(self) -> str:
        return f"KeyRef({self.key!r})"


def dumps(obj: Any) -> Pickled:
    """Pickle with the C pickler, large buffers out of band; cloudpickle for what the
    C pickler cannot do.

    Objects defined in ``__main__`` pickle fine by reference but would not load on a
    worker, whose ``__main__`` is not the user's script, so they go by value too.
    """
    buffers: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True  # in band
        buffers.append(raw)
        return False

    kind = type(obj)
    raw = kind is memoryview or (kind in (bytes, bytearray) and len(obj) >= OUT_OF_BAND_MIN)
    value = _Raw(obj) if raw else obj
    try:
        data = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    except (pickle.PicklingError, AttributeError, TypeError):
        buffers.clear()
        data = bytes(cloudpickle.dumps(value, protocol=5, buffer_callback=out_of_band))
    else:
        if b"__main__" in data or _names_by_value_module(data):
            buffers.clear()
            data = bytes(cloudpickle.dumps(value, protocol=5, buffer_callback=out_of_band))
    if not buffers and len(data) <= INLINE_MAX:
        return _unframed(data)
    return Payload([data, *buffers])


def _names_by_value_module(data: bytes) -> bool:
    """Whether ``data`` refers to a module registered with
    ``cloudpickle.register_pickle_by_value``: the C pickler sent its functions and
    classes by reference, but that module exists only where it was registered."""
    registered = cloudpickle.list_registry_pickle_by_value()
    return bool(registered) and any(name.encode() in data for name in registered)


#: Streams up to this many bytes lose their frame header (``_unframed``); past it,
#: 9 bytes are not worth a copy of the stream.
UNFRAMED_MAX = 1024
#: Protocol 5's opening (PROTO 5) and its FRAME opcode, which 8 bytes of length follow.
_PROTO_5 = b"\x80\x05"
_FRAME = 0x95


def _unframed(data: bytes) -> bytes:
    """``data`` without its one frame header, when it has one.

    The pickler frames its stream so that a reader can fetch it in large reads; a
    small stream is read from memory in one piece, and its 9-byte header is half of
    a small task's arguments (``(i,)`` pickles to 17 bytes): the scheduler holds the
    arguments of every queued task, and every message carries them. An unframed
    stream is as valid to ``pickle.loads``. Only a single frame that runs to the end
    is taken off (small streams have exactly one), and only from small streams.
    """
    if (
        11 < len(data) <= UNFRAMED_MAX
        and data[2] == _FRAME
        and data.startswith(_PROTO_5)
        and int.from_bytes(data[3:11], "little") == len(data) - 11
    ):
        return data[:2] + data[11:]
    return data


class _Raw:
    """A large ``bytes`` or ``bytearray``, or any ``memoryview``, pickled as one buffer
    (out of band when large).

    Pickle copies ``bytes`` and ``bytearray`` into its stream and cannot pickle a
    ``memoryview`` at all; this sends the memory as it is. A ``memoryview`` arrives as
    a flat, writable view of the buffer it was received into; a ``bytearray`` is that
    buffer when it is one (below a MiB), else one copy of it; a ``bytes`` value costs
    one copy on arrival (a ``bytes`` object cannot be received into).
    """

    __slots__ = ("value",)

    def __init__(self, value: bytes | bytearray | memoryview) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        view = memoryview(self.value)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        rebuild = _REBUILD[type(self.value)]
        return rebuild, (pickle.PickleBuffer(view.cast("B")),)


def _as_bytes(buffer: Any) -> bytes:
    return bytes(buffer)


def _as_bytearray(buffer: Any) -> bytearray:
    view = memoryview(buffer)
    if isinstance(view.obj, bytearray) and len(view.obj) == view.nbytes:
        return view.obj  # the buffer it was received into: no copy
    return bytearray(view)


def _as_view(buffer: Any) -> memoryview:
    return memoryview(buffer).cast("B")


_REBUILD: dict[type, Callable[[Any], Any]] = {
    bytes: _as_bytes,
    bytearray: _as_bytearray,
    memoryview: _as_view,
}


def loads(pickled: Pickled) -> Any:
    """The value ``dumps`` pickled."""
    if isinstance(pickled, Payload):
        return pickle.loads(pickled.frames[0], buffers=pickled.frames[1:])
    return pickle.loads(pickled)


def pack_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Pickled, set[str]]:
    """Pickle a call's arguments; return them with the keys they depend on."""
    return dumps_referring(_WithKwargs(args, dict(kwargs)) if kwargs else args)


def dumps_referring(obj: Any) -> tuple[Pickled, set[str]]:
    """Pickle ``obj``; return it with the keys of the results it refers to (the
    futures in it), which only a task's inputs can give it back."""
    collected: set[str] = set()
    token = _collected.set(collected)
    try:
        blob = dumps(obj)
    finally:
        _collected.reset(token)
    return blob, collected


@contextmanager
def task_inputs(inputs: Mapping[str, Any]) -> Iterator[None]:
    """Within this block, placeholders unpickle as the given input values."""
    token = _inputs.set(inputs)
    try:
        yield
    finally:
        _inputs.reset(token)


def unpack_call(blob: Pickled, inputs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` of a call, with dependency placeholders resolved."""
    # ``task_inputs`` written out: this runs for every task.
    token = _inputs.set(inputs)
    try:
        value = loads(blob)
    finally:
        _inputs.reset(token)
    if isinstance(value, _WithKwargs):
        return value.args, value.kwargs
    return value, {}


class _WithKwargs:
    """Marks a call with keyword arguments; calls without them pickle a bare tuple."""

    __slots__ = ("args", "kwargs")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs

    def __reduce__(self) -> tuple[type[_WithKwargs], tuple[tuple[Any, ...], dict[str, Any]]]:
        return _WithKwargs, (self.args, self.kwargs)


def dumps_function(func: object) -> bytes:
    """Pickle a task's function (or a call, a plugin: code sent to run elsewhere);
    cloudpickle, so script-defined functions go by value."""
    return bytes(cloudpickle.dumps(func, protocol=5))


def function_id(blob: bytes) -> str:
    """Content hash naming a pickled function, so workers can cache it."""
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def run_node(node: Any, inputs: Mapping[Any, Any]) -> Any:
    """Run a Dask task node; ``inputs`` holds the values of its dependencies by key."""
    return node(inputs)


def run_spec(spec: Any) -> Any:
    """Evaluate an old-style graph value: ``(func, *args)`` tuples are calls, lists map.

    References to other keys were already replaced by their values while unpickling.
    """
    if isinstance(spec, tuple) and spec and callable(spec[0]):
        func, *args = spec
        return func(*(run_spec(a) for a in args))
    if isinstance(spec, list):
        return [run_spec(item) for item in spec]
    return spec
