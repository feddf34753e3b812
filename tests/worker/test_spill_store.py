"""The spilling data store and the worker's scratch directory, on a temporary disk."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apportion.worker.local_directory import LOCK, PREFIX, LocalDirectory, remove_stale
from apportion.worker.sizeof import sizeof
from apportion.worker.spill import SpillStore

pytestmark = pytest.mark.timeout(10)

MiB = 2**20


class Point:
    """A class of a test module: pickled by reference."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.x == self.x


def files(store: SpillStore) -> list[str]:
    return sorted(os.listdir(store.directory)) if store.directory.exists() else []


@pytest.fixture
def store(tmp_path: Path) -> SpillStore:
    return SpillStore(tmp_path / "spill")


def test_values_round_trip_through_the_disk_equal(store: SpillStore) -> None:
    array = np.arange(100_000, dtype="float64").reshape(100, 1000)
    values: dict[str, Any] = {
        "array": array,
        "fortran": np.asfortranarray(array),
        "strided": array[:, ::3],  # not contiguous: pickled in band
        "records": np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
        "bytes": b"\x00\x01" * 1000,
        "dict": {"a": [1, 2.5, "three"], "b": {"nested": (4, None)}},
        "point": Point(7),
        "lambda": lambda x: x + 1,  # plain pickle refuses it: cloudpickle
    }
    for key, value in values.items():
        store[key] = value
    assert store.evict(10**12) == sum(sizeof(v) for v in values.values())
    assert store.spilled_count == len(values) and store.memory_bytes == 0
    assert len(files(store)) == len(values)
    for key in ("array", "fortran", "strided", "records"):
        loaded = store[key]
        np.testing.assert_array_equal(loaded, values[key])
        assert loaded.dtype == values[key].dtype and loaded.flags.writeable
    assert store["fortran"].flags.f_contiguous
    assert store["bytes"] == values["bytes"] and store["dict"] == values["dict"]
    assert store["point"] == Point(7) and store["lambda"](1) == 2
    assert files(store) == [] and store.spilled_bytes == 0 and store.disk_bytes == 0


def test_the_directory_is_made_for_the_user_only_on_the_first_spill(store: SpillStore) -> None:
    store["x"] = b"x" * 100
    assert not store.directory.exists()
    store.evict(1)
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700


def test_least_recently_used_goes_first_and_a_read_counts_as_use(store: SpillStore) -> None:
    for key in "abcd":
        store[key] = b"x" * 100
    assert store["a"] == b"x" * 100  # a is now the most recently used
    assert store.memory_keys() == ["b", "c", "d", "a"]
    assert store.evict(150) == 200  # whole values: b, then c
    assert sorted(store.spilled_keys()) == ["b", "c"]
    assert store["b"] == b"x" * 100  # read back: in memory again, the newest
    assert store.memory_keys() == ["d", "a", "b"] and store.spilled_keys() == ["c"]


def test_a_target_keeps_memory_under_it_on_every_write_and_read(tmp_path: Path) -> None:
    store = SpillStore(tmp_path, target=250)
    for key in "abc":
        store[key] = b"x" * 100
    assert store.memory_keys() == ["b", "c"] and store.spilled_keys() == ["a"]
    assert store.memory_bytes == 200 and store.spilled_bytes == 100
    store["a"]  # read back: it pushes the oldest out
    assert store.memory_keys() == ["c", "a"] and store.spilled_keys() == ["b"]
    store["huge"] = b"x" * 1000  # more than the target alone: straight to disk
    assert "huge" in store.spilled_keys() and store.memory_bytes <= 250


def test_the_mapping_sees_spilled_keys_without_reading_them(store: SpillStore) -> None:
    store["a"] = b"a" * 10
    store["b"] = b"b" * 10
    store.evict(10)
    assert "a" in store and "b" in store and "c" not in store
    assert sorted(store) == ["a", "b"] and len(store) == 2
    with pytest.raises(KeyError):
        store["c"]
    store["a"] = b"new"  # a spilled key written again: its file goes
    assert files(store) == [] and store["a"] == b"new"


def test_deleting_a_spilled_key_deletes_its_file(store: SpillStore) -> None:
    store["a"] = b"a" * 10
    store["b"] = b"b" * 10
    store.evict(100)
    assert len(files(store)) == 2
    del store["a"]
    assert len(files(store)) == 1 and "a" not in store
    assert store.spilled_bytes == sizeof(b"b" * 10)
    with pytest.raises(KeyError):
        del store["a"]
    store.clear()
    assert files(store) == [] and len(store) == 0
    assert (store.memory_bytes, store.spilled_bytes, store.disk_bytes) == (0, 0, 0)


def test_totals_count_every_file_written_and_read_and_never_go_down(store: SpillStore) -> None:
    store["a"] = b"a" * 1000
    store["b"] = b"b" * 1000
    store.evict(2000)
    written = store.bytes_written
    assert store.files_written == 2 and written == store.disk_bytes > 2000
    assert store["a"] == b"a" * 1000  # read back: its file goes, the totals stay
    assert (store.files_read, store.bytes_read) == (1, written // 2)
    del store["b"]  # deleted unread: no read
    store.evict(1000)
    assert store.files_written == 3 and store.bytes_written == written * 3 // 2
    store.clear()
    assert (store.files_written, store.files_read, store.disk_bytes) == (3, 1, 0)


def test_an_unpicklable_value_stays_in_memory_said_once(
    store: SpillStore, caplog: pytest.LogCaptureFixture
) -> None:
    lock = threading.Lock()
    store["lock"] = lock
    store["data"] = b"x" * 100
    with caplog.at_level(logging.WARNING, "apportion.worker"):
        assert store.evict(10**6) == 100
        assert store.evict(10**6) == 0  # nothing else can go
    assert store.memory_keys() == ["lock"] and store["lock"] is lock
    said = [r for r in caplog.records if "cannot spill 'lock'" in r.getMessage()]
    assert len(said) == 1 and "stays in memory" in said[0].getMessage()


def test_a_full_disk_keeps_the_value_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    store = SpillStore(blocker / "spill")  # cannot be made: any write fails
    store["x"] = b"x" * 100
    with caplog.at_level(logging.WARNING, "apportion.worker"):
        assert store.evict(100) == 0
    assert store.memory_keys() == ["x"] and "cannot spill 'x'" in caplog.text


def test_a_large_array_is_written_and_read_without_a_joined_copy(store: SpillStore) -> None:
    array = np.ones(16 * MiB // 8)
    store["big"] = array
    del array
    tracemalloc.start()
    try:
        store.evict(1)
        _, writing = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        loaded = store["big"]
        _, reading = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert writing < MiB  # straight from the array's memory to the file
    assert reading < 16 * MiB + MiB  # one buffer, which the loaded array uses
    assert loaded.sum() == 16 * MiB // 8


# --- the worker's scratch directory ----------------------------------------------


def test_a_local_directory_is_private_locked_and_removed(tmp_path: Path) -> None:
    directory = LocalDirectory(tmp_path / "base")
    assert directory.path.parent == tmp_path / "base"
    assert directory.path.name.startswith(PREFIX)
    assert stat.S_IMODE(directory.path.stat().st_mode) == 0o700
    assert (directory.path / LOCK).exists()
    assert remove_stale(tmp_path / "base") == []  # its lock is held: alive
    (directory.path / "spill").mkdir()
    directory.remove()
    directory.remove()
    assert directory.removed and not directory.path.exists()


def test_only_abandoned_worker_directories_are_removed(tmp_path: Path) -> None:
    unlocked = tmp_path / f"{PREFIX}no-lock-yet"
    unlocked.mkdir()
    other = tmp_path / "apportion-something-else"
    other.mkdir()
    (tmp_path / f"{PREFIX}a-file").write_text("")
    alive = LocalDirectory(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [unlocked.name, other.name, f"{PREFIX}a-file", alive.path.name]
    )
    alive.remove()


@pytest.mark.process
def test_the_directory_of_a_killed_worker_is_removed_by_the_next(tmp_path: Path) -> None:
    script = (
        "import os, signal, sys\n"
        "from apportion.worker.local_directory import LocalDirectory\n"
        "d = LocalDirectory(sys.argv[1])\n"
        "(d.path / 'spill').mkdir()\n"
        "(d.path / 'spill' / '0').write_bytes(b'x' * 1000)\n"
        "print(d.path, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == -9, result.stderr
    left = Path(result.stdout.strip())
    assert (left / "spill" / "0").exists()  # nobody removed it: it was killed
    fresh = LocalDirectory(tmp_path)
    assert not left.exists() and fresh.path.exists()
    fresh.remove()


def test_a_spill_file_lost_behind_its_back_loses_the_key_said_once(
    store: SpillStore, caplog: pytest.LogCaptureFixture
) -> None:
    store["a"] = b"a" * 10
    store.evict(10)
    (name,) = files(store)
    (store.directory / name).write_bytes(b"\x01")  # truncated
    with caplog.at_level(logging.ERROR, "apportion.worker"), pytest.raises(KeyError):
        store["a"]
    assert "a" not in store and files(store) == [] and store.spilled_bytes == 0
    assert "spilled value of 'a' cannot be read back" in caplog.text
