"""Values that arrived pickled, kept so until a thread that may run imports needs them.

A value put on this worker or fetched from a peer arrives as bytes, on the event
loop. Unpickling imports the modules of the value's classes, and a task thread
may be importing the same package at that moment (a task's first ``import
pandas`` while a neighbour partition, a DataFrame, arrives): Python's per-module
import locks then hand one of the two threads a half-made module (``cannot import
name ... from partially initialized module``; ``client.results.loads_here`` tells
the whole story). So the loop never unpickles: it stores a ``StillPickled`` in the
data store, and the value is unpickled on the task thread that takes it as an
input (``TaskRunner.run``), or on whichever thread reads it through
``Worker.data`` (``LoadingView``): each of those imports in the order of its own
code, as a program with no cluster would.

Until then the bytes are the value as far as the worker is concerned: its size is
their length, a peer or a client asking for it gets them as they came (no
unpickle, no pickle again), and spilling writes them to disk as they are and
reads them back as a ``StillPickled`` (``__reduce_ex__``), which imports nothing.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

from apportion.core.payload import Payload, Pickled, dumps, loads, size_of

#: Stands for "not unpickled yet" in ``StillPickled._value``.
_NOT_YET = object()
#: Locks for unpickling once, shared by values at random: a lock of its own would
#: cost every arriving value a third of its time on the loop, and one lock for all
#: would make task threads wait for each other's unpickling.
_LOCKS = tuple(threading.Lock() for _ in range(64))


class StillPickled:
    """A value as it arrived, unpickled once, on the first thread to ask (``load``).

    ``nbytes`` (what ``sizeof`` reads) stays the pickled length, the size the
    worker counted when it stored the value: the data store never sees a size change.
    """

    __slots__ = ("_blob", "_value", "nbytes")

    def __init__(self, blob: Pickled) -> None:
        self._blob: Pickled | None = blob
        self._value: Any = _NOT_YET
        self.nbytes = size_of(blob)

    @property
    def _lock(self) -> threading.Lock:
        return _LOCKS[id(self) >> 4 & 63]

    @property
    def loaded(self) -> bool:
        """Whether some thread unpickled it already."""
        return self._blob is None

    def load(self) -> Any:
        """The value, unpickled on this thread if no thread did yet.

        Once only (under a lock), so that every task sees the same object, as with a
        value computed here; the bytes are dropped then (a large buffer is not copied
        by unpickling: the value keeps it).
        """
        if self._blob is None:  # the common case once loaded: no lock to take
            return self._value
        with self._lock:
            if self._blob is not None:
                self._value = loads(self._blob)
                self._blob = None
            return self._value

    def pickled(self) -> Pickled:
        """The value's bytes to send: as they came while not unpickled, else pickled anew."""
        # No lock: the loop calls this, and a thread may hold the lock for as long
        # as an import takes. ``load`` sets the value before it drops the bytes.
        blob = self._blob
        return blob if blob is not None else dumps(self._value)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # How the spill store writes it: the bytes as they are, each frame as a buffer
        # of its own (out of band when large), read back as a StillPickled again.
        # Once unpickled, the value itself is written, and read back as the value.
        # No lock, as in ``pickled``.
        blob = self._blob
        if blob is None:
            return _identity, (self._value,)
        frames = (blob,) if isinstance(blob, bytes) else blob.frames
        return _rebuild, tuple(pickle.PickleBuffer(frame) for frame in frames)

    def __repr__(self) -> str:
        state = "unpickled" if self.loaded else "pickled"
        return f"<StillPickled {self.nbytes:,} bytes, {state}>"


def _rebuild(*frames: Any) -> StillPickled:
    if len(frames) == 1 and isinstance(frames[0], bytes):
        return StillPickled(frames[0])
    return StillPickled(Payload(frames))


def _identity(value: Any) -> Any:
    return value


def loaded(value: Any) -> Any:
    """``value``, unpickled on this thread if it is still pickled."""
    return value.load() if type(value) is StillPickled else value


def pickled(value: Any) -> Pickled:
    """``value``'s bytes to send: a still-pickled value's as they are."""
    return value.pickled() if type(value) is StillPickled else dumps(value)


class LoadingView(MutableMapping[str, Any]):
    """The worker's data store as user code sees it (``Worker.data``): real values,
    each still-pickled one unpickled on the reading thread.

    Writes, deletes and membership go straight to the store; reading every value
    (``items()``) unpickles every value, as a user iterating the data expects.
    """

    __slots__ = ("store",)

    def __init__(self, store: MutableMapping[str, Any]) -> None:
        #: The data store itself, still-pickled values and all (the worker's own view).
        self.store = store

    def __getitem__(self, key: str) -> Any:
        return loaded(self.store[key])

    def __setitem__(self, key: str, value: Any) -> None:
        self.store[key] = value

    def __delitem__(self, key: str) -> None:
        del self.store[key]

    def __contains__(self, key: object) -> bool:
        return key in self.store

    def __iter__(self) -> Iterator[str]:
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)

    def __repr__(self) -> str:
        return f"<LoadingView of {self.store!r}>"
