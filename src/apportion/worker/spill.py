"""A data store that moves the least recently used results to disk.

``SpillStore`` is the worker's ``data`` when it has a memory limit. Values live in
memory in least-recently-used order, each with its ``sizeof`` estimate. ``evict``
moves the oldest to files until enough bytes went; with a ``target``, every write
(and every read of a spilled value) evicts until the values in memory fit under it
again, so a burst of results never waits for the memory monitor's next look.
Reading a spilled key (``data[key]``) loads it back and counts it as used now;
``del data[key]`` deletes its file without reading it (``pop`` would read it). A
file that cannot be read back loses its key (``KeyError``, said in the log), as a
lost worker loses its results: the scheduler computes them again.

A file holds one value pickled as it travels (``core.payload.dumps``: protocol 5,
large buffers out of band, cloudpickle for what plain pickle refuses): a short
header of lengths, then each frame written straight from the value's memory, so a
large NumPy array is never copied into one joined ``bytes`` on its way out. It
comes back through ``readinto`` preallocated ``bytearray`` s: one copy, from the
file into memory the array then owns (and may write to). A value that cannot be
pickled, or one a full disk refuses, stays in memory, said once in the log.

Keys map to numbered file names, so a key may hold any character. The store is
locked for each call: the event loop and task threads (``get_worker().data``) may
share it. Reads and writes are synchronous, as in Dask's spill buffer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from apportion.core.payload import Payload, dumps, loads
from apportion.worker.sizeof import sizeof

logger = logging.getLogger("apportion.worker")

#: Header of a spill file: the number of frames (``core.payload``: the pickle stream,
#: then the out-of-band buffers), then one length per frame (little-endian, 64-bit).
_COUNT = struct.Struct("<Q")
_LENGTH = struct.Struct("<Q")

_MISSING = object()


class SpillStore(MutableMapping[str, Any]):
    """Values in memory in LRU order, the oldest moved to files in ``directory``.

    ``directory`` is created (user-only) on the first spill. ``target``: bytes of
    values in memory that a write may leave, at most (None: spill only when told).
    """

    def __init__(self, directory: str | Path, target: int | None = None) -> None:
        self.directory = Path(directory)
        self.target = target
        #: Values in memory, least recently used first.
        self._fast: OrderedDict[str, Any] = OrderedDict()
        #: ``sizeof`` of every key, in memory or on disk.
        self._sizes: dict[str, int] = {}
        #: Key on disk -> (file name, bytes in the file).
        self._files: dict[str, tuple[str, int]] = {}
        #: Keys whose value cannot be spilled (unpicklable, refused by the disk):
        #: kept in memory and skipped by ``evict``; forgotten when the key is written again.
        self._stuck: set[str] = set()
        self._next_file = 0
        #: Bytes of values in memory, by ``sizeof``; the managed memory.
        self.memory_bytes = 0
        #: Bytes of values on disk, by ``sizeof`` (what they take once loaded).
        self.spilled_bytes = 0
        #: Bytes of the spill files.
        self.disk_bytes = 0
        #: Since the store was made (never lower): files written and read back, and
        #: their bytes. What a run spilled in all, where the fields above say what is
        #: spilled now.
        self.files_written = 0
        self.bytes_written = 0
        self.files_read = 0
        self.bytes_read = 0
        self._lock = threading.RLock()

    # --- the mapping ----------------------------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        self.store_sized(key, value, sizeof(value))

    def store_sized(self, key: str, value: Any, nbytes: int) -> None:
        """``self[key] = value`` whose ``sizeof`` is known already (``nbytes``): a task's
        result was measured on its thread as it ended."""
        with self._lock:
            self._discard(key)
            self._keep(key, value, nbytes)
            self._fit_target()

    def __getitem__(self, key: str) -> Any:
        with self._lock:
            value = self._fast.get(key, _MISSING)
            if value is not _MISSING:
                self._fast.move_to_end(key)
                return value
            if key not in self._files:
                raise KeyError(key)
            try:
                value = self._load(key)
            except Exception as exc:
                # Gone or damaged (a clean-up of the temporary directory, a full disk
                # that truncated it): the value is lost, as with a lost worker.
                logger.error("spilled value of %r cannot be read back (%s); it is lost", key, exc)
                self._discard(key)
                raise KeyError(key) from exc
            self._keep(key, value, self._sizes[key])
            self._fit_target()
            return value

    def __delitem__(self, key: str) -> None:
        with self._lock:
            if not self._discard(key):
                raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in self._fast or key in self._files

    def __len__(self) -> int:
        return len(self._fast) + len(self._files)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            keys = [*self._fast, *self._files]
        return iter(keys)

    def clear(self) -> None:
        """Forget every value and delete every file, without reading any back."""
        with self._lock:
            for key in list(self._files):
                self._discard(key)
            self._fast.clear()
            self._sizes.clear()
            self._stuck.clear()
            self.memory_bytes = 0

    # --- spilling -------------------------------------------------------------------

    @property
    def spilled_count(self) -> int:
        """How many keys are on disk."""
        return len(self._files)

    def spilled_keys(self) -> list[str]:
        """The keys on disk, in no particular order."""
        with self._lock:
            return list(self._files)

    def memory_keys(self) -> list[str]:
        """The keys in memory, least recently used first."""
        with self._lock:
            return list(self._fast)

    def evict(self, nbytes: int) -> int:
        """Move least-recently-used values to disk until ``nbytes`` went (or none is
        left that can go); returns the bytes moved, by ``sizeof``."""
        with self._lock:
            moved = 0
            for key in list(self._fast):
                if moved >= nbytes:
                    break
                if key not in self._stuck:
                    moved += self._spill(key)
            return moved

    def _fit_target(self) -> None:
        if self.target is not None and self.memory_bytes > self.target:
            self.evict(self.memory_bytes - self.target)

    def _keep(self, key: str, value: Any, size: int) -> None:
        """Hold ``value`` in memory as the most recently used."""
        self._fast[key] = value
        self._sizes[key] = size
        self.memory_bytes += size

    def _discard(self, key: str) -> bool:
        """Forget ``key`` wherever it is; False if it was nowhere."""
        self._stuck.discard(key)
        if key in self._fast:
            del self._fast[key]
            self.memory_bytes -= self._sizes.pop(key)
            return True
        entry = self._files.pop(key, None)
        if entry is None:
            return False
        self.spilled_bytes -= self._sizes.pop(key)
        self.disk_bytes -= entry[1]
        self._remove_file(entry[0])
        return True

    def _spill(self, key: str) -> int:
        """Write ``key``'s value to a file and drop it from memory; its size, or 0."""
        value = self._fast[key]
        try:
            pickled = dumps(value)
        except Exception as exc:
            self._stuck.add(key)
            logger.warning(
                "cannot spill %r to disk (%s cannot be pickled: %s); it stays in memory",
                key,
                type(value).__name__,
                exc,
            )
            return 0
        name = str(self._next_file)
        self._next_file += 1
        try:
            written = self._write(name, [pickled] if isinstance(pickled, bytes) else pickled.frames)
        except OSError as exc:
            self._stuck.add(key)
            self._remove_file(name)
            logger.warning(
                "cannot spill %r to %s (%s); it stays in memory", key, self.directory, exc
            )
            return 0
        del self._fast[key]
        size = self._sizes[key]
        self.memory_bytes -= size
        self.spilled_bytes += size
        self.disk_bytes += written
        self.files_written += 1
        self.bytes_written += written
        self._files[key] = (name, written)
        return size

    def _write(self, name: str, frames: Sequence[bytes | bytearray | memoryview]) -> int:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lengths = [memoryview(frame).nbytes for frame in frames]
        with open(self.directory / name, "xb") as file:
            file.write(_COUNT.pack(len(frames)))
            file.write(b"".join(_LENGTH.pack(n) for n in lengths))
            for frame in frames:
                file.write(frame)  # straight from the value's memory: no joined copy
        return _COUNT.size + _LENGTH.size * len(frames) + sum(lengths)

    def _load(self, key: str) -> Any:
        """Read ``key``'s value back and delete its file."""
        name, written = self._files[key]
        path = self.directory / name
        with open(path, "rb") as file:
            (count,) = _COUNT.unpack(_read_exactly(file, _COUNT.size))
            lengths = [
                _LENGTH.unpack_from(_read_exactly(file, _LENGTH.size))[0] for _ in range(count)
            ]
            frames = []
            for length in lengths:
                frame = bytearray(length)
                if file.readinto(frame) != length:
                    raise OSError(f"spill file {path} of {key!r} is truncated")
                frames.append(frame)
        value = loads(Payload(frames))
        del self._files[key]
        self.spilled_bytes -= self._sizes[key]
        self.disk_bytes -= written
        self.files_read += 1
        self.bytes_read += written
        self._remove_file(name)
        return value

    def _remove_file(self, name: str) -> None:
        # A file that cannot go (already gone, never made) is no loss: the directory
        # is removed with the worker.
        with contextlib.suppress(OSError):
            os.unlink(self.directory / name)

    def __repr__(self) -> str:
        return (
            f"<SpillStore {self.directory}: {len(self._fast)} in memory "
            f"({self.memory_bytes} bytes), {len(self._files)} spilled ({self.spilled_bytes} bytes)>"
        )


def _read_exactly(file: Any, n: int) -> bytes:
    data: bytes = file.read(n)
    if len(data) != n:
        raise OSError(f"spill file {file.name} is truncated")
    return data
