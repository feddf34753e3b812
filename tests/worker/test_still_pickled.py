"""Values arriving at a worker stay pickled until a task (or user code) needs them,
and are unpickled on that thread, never on the worker's event loop.

``Recorded`` notes the thread each of its instances is rebuilt on: a list of thread
names that must hold task threads only (``apportion-task-*``), or the reader's.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from test_worker_service import compute, get, run

from apportion.core.payload import KeyRef, Payload, dumps, loads
from apportion.protocol.peer_data import DataStored, PutData
from apportion.protocol.worker import FreeKeys, TaskFinished, TaskRaised
from apportion.worker.service import Worker
from apportion.worker.spill import SpillStore
from apportion.worker.still_pickled import LoadingView, StillPickled, loaded, pickled
from fake_scheduler import FakeScheduler

#: The names of the threads ``Recorded`` instances were rebuilt on, in order.
REBUILT: list[str] = []


def rebuild(n: int) -> Recorded:
    REBUILT.append(threading.current_thread().name)
    return Recorded(n)


class Recorded:
    """A value whose unpickling is seen: ``REBUILT`` gets the thread's name."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return rebuild, (self.n,)


def read_n(value: Recorded, plus: int) -> int:
    assert type(value) is Recorded  # a real value, never the still-pickled bytes
    return value.n + plus


@pytest.fixture(autouse=True)
def fresh() -> None:
    REBUILT.clear()


def test_a_still_pickled_value_is_its_bytes_until_loaded_once() -> None:
    blob = dumps(Recorded(3))
    value = StillPickled(blob)
    assert value.nbytes == len(blob) and not value.loaded
    assert pickled(value) is blob and REBUILT == []  # served as it came
    first = loaded(value)
    assert value.loaded and loaded(value) is first and first.n == 3  # one object for all
    assert [threading.current_thread().name] == REBUILT
    assert loads(pickled(value)).n == 3  # pickled anew once unpickled
    assert loaded(5) == 5 and loads(pickled(5)) == 5  # plain values pass through


def test_a_still_pickled_value_spills_as_its_bytes_and_comes_back_still_pickled(
    tmp_path: Path,
) -> None:
    store = SpillStore(tmp_path / "spill")
    small, large = dumps(Recorded(1)), dumps(bytearray(b"z" * 300_000))
    assert isinstance(large, Payload) and len(large.frames) == 2  # out of band
    store["small"], store["large"] = StillPickled(small), StillPickled(large)
    assert store.memory_bytes == len(small) + large.nbytes  # sized by their bytes
    store.evict(10**9)
    assert store.spilled_count == 2 and REBUILT == []
    back, big = store["small"], store["large"]
    assert type(back) is StillPickled and not back.loaded and back.pickled() == small
    assert type(big) is StillPickled and big.pickled() == large
    assert REBUILT == []  # written and read back without unpickling
    assert back.load().n == 1 and big.load() == bytearray(b"z" * 300_000)
    # Once unpickled, the value itself spills, and comes back as itself.
    store.evict(10**9)
    assert store["small"].n == 1 and type(store["small"]) is Recorded


def test_a_loading_view_gives_real_values_and_writes_through() -> None:
    store: dict[str, Any] = {"x": StillPickled(dumps(Recorded(2))), "y": 7}
    view = LoadingView(store)
    assert view["y"] == 7 and sorted(view) == ["x", "y"] and len(view) == 2 and "x" in view
    assert view["x"].n == 2 and [threading.current_thread().name] == REBUILT
    view["z"] = 1
    del view["y"]
    assert sorted(store) == ["x", "z"]


@pytest.mark.timeout(30)
def test_an_arriving_value_is_unpickled_on_the_task_thread_and_served_as_it_came() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1), Worker(scheduler.address) as b:
            conn_a, _ = await scheduler.next_worker()
            conn_b, _ = await scheduler.next_worker()
            blob = dumps(Recorded(5))
            conn_b.send(PutData(1, {"x": blob, "w": dumps(Recorded(9))}))
            assert (await scheduler.expect(conn_b, DataStored)).keys == ["x", "w"]
            assert type(b.store["x"]) is StillPickled and REBUILT == []  # not on the loop
            # A peer fetches it: served as it came, still not unpickled on b.
            send_compute(conn_a, "on-a", read_n, KeyRef("x"), 1, who_has={"x": [b.address]})
            assert (await scheduler.expect(conn_a, TaskFinished)).key == "on-a"
            assert loads((await get(conn_a, scheduler, "on-a")).data["on-a"]) == 6
            assert (await get(conn_b, scheduler, "x")).data["x"] == blob
            assert not b.store["x"].loaded
            # a unpickled its copy on its task thread, for its task.
            assert len(REBUILT) == 1 and REBUILT[0].startswith("apportion-task-")
            send_compute(conn_b, "on-b", read_n, KeyRef("x"), 2, who_has={"x": [b.address]})
            assert (await scheduler.expect(conn_b, TaskFinished)).key == "on-b"
            assert loads((await get(conn_b, scheduler, "on-b")).data["on-b"]) == 7
            assert len(REBUILT) == 2 and REBUILT[1].startswith("apportion-task-")
            assert b.store["x"].loaded
            # User code reading the data (a ``dask_worker`` function) gets real values,
            # unpickled on its own thread.
            value = await asyncio.to_thread(lambda: b.data["w"])
            assert type(value) is Recorded and value.n == 9
            assert len(REBUILT) == 3 and not REBUILT[2].startswith("apportion-task-")
            conn_b.send(FreeKeys(["x", "w"]))

    run(scenario)


def send_compute(conn: Any, key: str, func: Any, *args: Any, **extra: Any) -> None:
    for message in compute(key, func, *args, **extra):
        conn.send(message)


@pytest.mark.timeout(30)
def test_an_arrived_value_that_cannot_be_unpickled_fails_the_task_that_needs_it() -> None:
    async def scenario(scheduler: FakeScheduler) -> None:
        async with Worker(scheduler.address, nthreads=1) as worker:
            conn, _ = await scheduler.next_worker()
            broken = b"\x80\x05cno_such_module_anywhere\nThing\n."
            conn.send(PutData(1, {"x": broken}))
            await scheduler.expect(conn, DataStored)
            send_compute(conn, "y", read_n, KeyRef("x"), 1, who_has={"x": [worker.address]})
            raised = await scheduler.expect(conn, TaskRaised)
            assert raised.key == "y"
            with pytest.raises(ModuleNotFoundError, match="no_such_module_anywhere"):
                raise loads(raised.exception)

    run(scenario)


#: Set to let ``SlowToRebuild`` instances finish unpickling; ``STARTED`` once one began.
RELEASE = threading.Event()
STARTED = threading.Event()


def rebuild_slowly(n: int) -> SlowToRebuild:
    STARTED.set()
    assert RELEASE.wait(10)
    return SlowToRebuild(n)


class SlowToRebuild(Recorded):
    """Unpickles only once ``RELEASE`` is set, as a value whose package takes long to
    import."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return rebuild_slowly, (self.n,)


def test_serving_and_spilling_never_wait_for_a_thread_unpickling(tmp_path: Path) -> None:
    RELEASE.clear()
    STARTED.clear()
    blob = dumps(SlowToRebuild(4))
    value = StillPickled(blob)
    store = SpillStore(tmp_path / "spill")
    store["x"] = value
    loading = threading.Thread(target=value.load)
    loading.start()
    try:
        assert STARTED.wait(10)
        # The loop serves and spills it meanwhile, from the bytes, without waiting.
        assert pickled(value) is blob
        assert store.evict(10**9) == len(blob) and store.spilled_count == 1
    finally:
        RELEASE.set()
        loading.join(10)
    assert value.loaded and loaded(value).n == 4
    assert type(store["x"]) is StillPickled and loaded(store["x"]).n == 4
