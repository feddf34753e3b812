"""How functions, arguments and results become bytes, and back.

Dependencies need no walk over the arguments: a ``Future`` (or a key reference
from an old-style graph) pickles as a call to ``_input(key)``. On the client,
``pack_call`` records every key pickled that way, which gives the task's
dependencies. On the worker, ``unpack_call`` unpickles with the task's input
values in scope, so each placeholder turns straight into its value wherever it
sits, nested in lists, dicts or objects. Pickling stays in C for plain data.

The scheduler never calls anything here: it forwards these bytes unopened.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import cloudpickle

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


def dumps(obj: Any) -> bytes:
    """Pickle with the C pickler; fall back to cloudpickle for what it cannot do.

    Objects defined in ``__main__`` pickle fine by reference but would not load on a
    worker, whose ``__main__`` is not the user's script, so they go by value too.
    """
    try:
        data = pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        return bytes(cloudpickle.dumps(obj, protocol=5))
    if b"__main__" in data:
        return bytes(cloudpickle.dumps(obj, protocol=5))
    return data


def loads(data: bytes) -> Any:
    """Unpickle bytes made by ``dumps``."""
    return pickle.loads(data)


def pack_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[bytes, set[str]]:
    """Pickle a call's arguments; return them with the keys they depend on."""
    collected: set[str] = set()
    token = _collected.set(collected)
    try:
        blob = dumps(_WithKwargs(args, dict(kwargs)) if kwargs else args)
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


def unpack_call(blob: bytes, inputs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` of a call, with dependency placeholders resolved."""
    with task_inputs(inputs):
        value = loads(blob)
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
