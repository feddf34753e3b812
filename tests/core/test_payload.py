"""Pickled values: small ones stay one bytes object, large buffers travel out of band,
and a value rebuilt from received buffers lives in them (no copy)."""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd
import pytest

from apportion.core.payload import (
    OUT_OF_BAND_MIN,
    UNFRAMED_MAX,
    Payload,
    Pickled,
    dumps,
    hash_into,
    loads,
    pack_call,
    size_of,
    unpack_call,
)


def received(pickled: Pickled) -> Pickled:
    """``pickled`` as the receiving side holds it: every frame in a fresh bytearray."""
    if isinstance(pickled, bytes):
        return pickled
    return Payload([memoryview(bytearray(frame)) for frame in pickled.frames])


def _array_memory(frame: Any) -> np.ndarray[Any, Any]:
    return np.frombuffer(frame, dtype=np.uint8)


SIZES = [0, 1, OUT_OF_BAND_MIN - 1, OUT_OF_BAND_MIN, 3 * 2**20 + 5]


@pytest.mark.parametrize("size", SIZES)
def test_numpy_arrays_round_trip_and_large_ones_are_rebuilt_in_the_received_buffer(
    size: int,
) -> None:
    array = np.arange(size, dtype=np.uint8)
    pickled = dumps(array)
    out_of_band = isinstance(pickled, Payload) and len(pickled.frames) > 1
    assert out_of_band == (size >= OUT_OF_BAND_MIN)
    back = loads(received(pickled))
    assert back.dtype == array.dtype and np.array_equal(back, array)
    if out_of_band:
        assert isinstance(pickled, Payload)
        # Sent from the array's own memory, rebuilt over the buffer it arrived in.
        assert np.shares_memory(_array_memory(pickled.frames[1]), array)
        arrived = received(pickled)
        assert isinstance(arrived, Payload)
        rebuilt = loads(arrived)
        assert np.shares_memory(rebuilt, _array_memory(arrived.frames[1]))
        assert rebuilt.flags.writeable


@pytest.mark.parametrize("size", SIZES)
def test_bytes_bytearrays_and_memoryviews_round_trip(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    for value in (data, bytearray(data), memoryview(data)):
        back = loads(received(dumps(value)))
        assert type(back) is type(value) and bytes(back) == data


def test_a_large_bytearray_is_the_very_buffer_it_arrived_in() -> None:
    value = bytearray(b"x" * (2 * OUT_OF_BAND_MIN))
    pickled = dumps(value)
    assert isinstance(pickled, Payload) and len(pickled.frames) == 2
    assert np.shares_memory(_array_memory(pickled.frames[1]), _array_memory(value))
    arrived = received(pickled)
    assert isinstance(arrived, Payload)
    back = loads(arrived)
    assert back is memoryview(arrived.frames[1]).obj and back == value


def test_a_memoryview_of_a_numpy_array_arrives_as_flat_bytes() -> None:
    array = np.arange(OUT_OF_BAND_MIN, dtype=np.int32)
    back = loads(received(dumps(memoryview(array))))
    assert isinstance(back, memoryview) and back.format == "B"
    assert bytes(back) == array.tobytes()


def test_pandas_frames_send_their_columns_out_of_band() -> None:
    frame = pd.DataFrame({"a": np.arange(50_000), "b": np.linspace(0, 1, 50_000)})
    pickled = dumps(frame)
    assert isinstance(pickled, Payload) and len(pickled.frames) >= 3
    assert loads(received(pickled)).equals(frame)


def test_small_values_stay_one_bytes_object_as_before() -> None:
    for value in (1, "text", {"a": [1, 2]}, np.arange(10), b"abc"):
        pickled = dumps(value)
        assert isinstance(pickled, bytes)
        assert pickle.loads(pickled) is not None or value is None
        back = loads(pickled)
        assert np.array_equal(back, value) if isinstance(value, np.ndarray) else back == value


def test_small_pickles_lose_their_frame_header_and_still_load() -> None:
    # (i,) pickles to 17 bytes, 9 of them the frame header: the scheduler holds the
    # arguments of every queued task.
    framed = pickle.dumps((12345,), protocol=5)
    pickled = dumps((12345,))
    assert isinstance(pickled, bytes) and len(pickled) == len(framed) - 9
    assert pickled == framed[:2] + framed[11:]
    assert loads(pickled) == (12345,) and pickle.loads(pickled) == (12345,)
    assert dumps(()) == pickle.dumps((), protocol=5)  # too short to carry a frame


def test_larger_in_band_pickles_keep_their_frame() -> None:
    value = "x" * (2 * UNFRAMED_MAX)
    pickled = dumps(value)
    assert pickled == pickle.dumps(value, protocol=5)
    assert loads(pickled) == value


def test_a_large_in_band_pickle_travels_as_a_frame_of_its_own() -> None:
    value = list(range(100_000))
    pickled = dumps(value)
    assert isinstance(pickled, Payload) and len(pickled.frames) == 1
    assert loads(received(pickled)) == value


def test_size_and_hash_cover_every_frame() -> None:
    import hashlib

    one = dumps(np.zeros(OUT_OF_BAND_MIN, np.uint8))
    other = dumps(np.ones(OUT_OF_BAND_MIN, np.uint8))
    assert size_of(one) == size_of(other) > OUT_OF_BAND_MIN
    assert size_of(b"abc") == 3
    digest = hash_into(hashlib.blake2b(), one).hexdigest()
    assert digest != hash_into(hashlib.blake2b(), other).hexdigest()
    assert digest == hash_into(hashlib.blake2b(), received(one)).hexdigest()


def test_call_arguments_carry_large_buffers_out_of_band() -> None:
    array = np.arange(OUT_OF_BAND_MIN, dtype=np.uint8)
    pickled, deps = pack_call((array,), {"scale": 2})
    assert isinstance(pickled, Payload) and deps == set()
    args, kwargs = unpack_call(received(pickled), {})
    assert np.array_equal(args[0], array) and kwargs == {"scale": 2}


def test_a_payload_needs_its_pickle_stream() -> None:
    with pytest.raises(ValueError, match="at least its pickle stream"):
        Payload([])


def test_what_a_by_value_module_defines_goes_by_value_inside_arguments(tmp_path: Path) -> None:
    """A function or class of a module registered with ``register_pickle_by_value``,
    passed as an argument, must not go by reference: the worker lacks that module."""
    source = tmp_path / "only_here_module.py"
    source.write_text("def double(x):\n    return 2 * x\n\n\nclass Box:\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("only_here_module")
        cloudpickle.register_pickle_by_value(module)
        try:
            blob = dumps([module.double, module.Box])
        finally:
            cloudpickle.unregister_pickle_by_value(module)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_here_module", None)
    # Loaded where the module cannot be imported: by value, it needs no import.
    double, box = loads(blob)
    assert double(21) == 42
    assert box.__name__ == "Box"
    assert "only_here_module" not in sys.modules
