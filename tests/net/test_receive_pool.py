"""The receive pool: large buffers reuse the memory of buffers no longer used."""

from __future__ import annotations

import gc
import os
import pickle
import threading

import numpy as np
import pytest

from apportion.net import lending
from apportion.net.lending import address_of, read_lent
from apportion.net.receive_pool import STEP, ReceivePool

pytestmark = pytest.mark.timeout(30)

MiB = 1 << 20


def test_a_freed_buffer_is_reused_for_the_next_of_its_size() -> None:
    pool = ReceivePool()
    first = pool.take(5 * MiB)
    where = address_of(first)
    first[:3] = b"abc"
    del first
    gc.collect()
    assert pool.free_bytes == 6 * MiB  # sized in huge pages
    again = pool.take(5 * MiB + 1)
    assert address_of(again) == where and pool.reused == 1 and pool.free_bytes == 0
    assert again.nbytes == 5 * MiB + 1 and not again.readonly


def test_a_buffer_in_use_is_never_handed_out_again() -> None:
    pool = ReceivePool()
    held = [pool.take(4 * MiB) for _ in range(3)]
    assert len({address_of(b) for b in held}) == 3 and pool.reused == 0


def test_a_value_rebuilt_over_a_buffer_keeps_it_from_the_pool() -> None:
    pool = ReceivePool()
    array = np.arange(MiB // 8, dtype=np.float64)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(array, protocol=5, buffer_callback=buffers.append)
    raw = buffers[0].raw()
    buffer = pool.take(raw.nbytes)
    buffer[:] = raw
    back = pickle.loads(data, buffers=[buffer])
    del buffer
    gc.collect()
    assert pool.free_bytes == 0  # the array still lives in it
    assert np.array_equal(back, array)
    del back
    gc.collect()
    assert pool.free_bytes == STEP


def test_a_much_larger_map_is_not_spent_on_a_small_buffer() -> None:
    pool = ReceivePool()
    big = pool.take(64 * MiB)
    del big
    gc.collect()
    small = pool.take(2 * MiB)
    assert pool.reused == 0 and pool.free_bytes == 64 * MiB
    del small


def test_unused_maps_are_kept_up_to_the_limit_and_cleared_on_demand() -> None:
    pool = ReceivePool(limit=8 * MiB)
    buffers = [pool.take(4 * MiB) for _ in range(3)]
    del buffers
    gc.collect()
    assert pool.free_bytes == 8 * MiB  # the third was unmapped
    pool.cap(4 * MiB)
    assert pool.free_bytes == 0 and pool.limit == 4 * MiB
    pool.cap(100 * MiB)
    assert pool.limit == 4 * MiB  # the lowest cap holds
    kept = pool.take(4 * MiB)
    del kept
    gc.collect()
    assert pool.free_bytes == 4 * MiB
    pool.clear()
    assert pool.free_bytes == 0


def test_a_buffer_last_used_in_another_thread_returns_to_the_pool() -> None:
    pool = ReceivePool()
    box = [pool.take(2 * MiB)]

    def drop() -> None:
        box.clear()
        gc.collect()

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join()
    assert pool.free_bytes == 2 * MiB


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _mapped(address: int) -> bool:
    """Whether this process has memory at ``address`` (read with ``process_vm_readv``)."""
    try:
        read_lent(os.getpid(), address, memoryview(bytearray(1)))
    except OSError:
        return False
    return True


def test_maps_unused_for_idle_for_seconds_are_unmapped() -> None:
    clock = Clock()
    pool = ReceivePool(idle_for=2.0, clock=clock)
    first, second = pool.take(4 * MiB), pool.take(8 * MiB)
    where = address_of(first)
    del first  # unused from 100.0
    clock.now = 101.5
    del second  # unused from 101.5
    gc.collect()
    assert pool.free_bytes == 12 * MiB
    clock.now = 101.9
    assert pool.release_idle() == 0 and pool.free_bytes == 12 * MiB
    clock.now = 102.0
    assert pool.release_idle() == 4 * MiB and pool.free_bytes == 8 * MiB
    if lending.enabled():
        assert not _mapped(where)  # given back to the system, not only forgotten
    again = pool.take(4 * MiB)
    assert pool.reused == 0 and pool.free_bytes == 8 * MiB  # fresh memory
    clock.now = 103.5
    assert pool.release_idle() == 8 * MiB and pool.free_bytes == 0
    del again


def test_the_map_returned_last_is_reused_first_so_the_others_age_out() -> None:
    clock = Clock()
    pool = ReceivePool(idle_for=2.0, clock=clock)
    older, newer = pool.take(4 * MiB), pool.take(4 * MiB)
    newest_place = address_of(newer)
    del older
    clock.now = 101.0
    del newer
    gc.collect()
    reused = pool.take(4 * MiB)
    assert address_of(reused) == newest_place and pool.reused == 1
    clock.now = 102.0
    assert pool.release_idle() == 4 * MiB and pool.free_bytes == 0
    del reused  # back at 102.0: it stays for two more seconds
    gc.collect()
    clock.now = 103.9
    assert pool.release_idle() == 0 and pool.free_bytes == 4 * MiB
