"""``task_resources``, ``task_environment`` and cancel events, without a worker service."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from apportion import task_cancel_event, task_environment, task_resources
from apportion.core.allocation import NOTHING, Allocation
from apportion.core.payload import dumps_function, function_id, pack_call
from apportion.worker.context import (
    ActorHere,
    TaskInterrupted,
    awaiting_actor,
    local_actor,
    running_actor,
    running_task,
    task_interrupted,
)
from apportion.worker.events import Execute
from apportion.worker.execution import Finished, Raised, TaskRunner


@contextmanager
def holding(
    resources: Mapping[str, int],
    units: Mapping[str, Sequence[str]] | None = None,
    pools: Mapping[str, Sequence[str]] | None = None,
) -> Iterator[None]:
    """Run the block as a task holding ``resources`` on a worker offering ``pools``."""
    worker: Any = SimpleNamespace(units=pools or {})
    allocation = Allocation(dict(resources), {k: list(v) for k, v in (units or {}).items()})
    command = Execute("k", "f", b"", (), allocation)
    with running_task(worker, command, threading.Event()):
        yield


@pytest.mark.timeout(5)
def test_indexed_pools_give_labels_and_amount_pools_amounts() -> None:
    units = {"gpu": ["2", "3"]}
    with holding({"gpu": 20_000, "MEMORY": 7 * 10**14}, units, {"gpu": ["0", "1", "2", "3"]}):
        assert task_resources() == {"gpu": [2, 3], "MEMORY": 7e10}


@pytest.mark.timeout(5)
def test_a_fractional_request_shows_the_one_unit_it_shares() -> None:
    with holding({"gpu": 5_000}, {"gpu": ["0"]}, {"gpu": ["0", "1"]}):
        assert task_resources() == {"gpu": [0]}
        env = task_environment({})
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "APPORTION_RESOURCE_GPU": "0"}


@pytest.mark.timeout(5)
def test_labels_stay_text_unless_the_whole_pool_is_numbered() -> None:
    pool = ["0", "1", "MIG-a"]
    with holding({"gpu": 10_000}, {"gpu": ["0"]}, {"gpu": pool}):
        assert task_resources() == {"gpu": ["0"]}
    with holding({"gpu": 10_000}, {"gpu": ["MIG-a"]}, {"gpu": pool}):
        assert task_resources() == {"gpu": ["MIG-a"]}


@pytest.mark.timeout(5)
def test_environment_names_every_pool_held() -> None:
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    resources = {"GPU": 20_000, "licence.pro": 5_000, "MEMORY": 7 * 10**14}
    with holding(resources, {"GPU": ["4", "5"]}):
        env = task_environment(base)
    assert env == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "4,5",
        "APPORTION_RESOURCE_GPU": "4,5",
        "APPORTION_RESOURCE_LICENCE_PRO": "0.5",
        "APPORTION_RESOURCE_MEMORY": "70000000000",
    }
    assert base["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # a copy, not the caller's mapping


@pytest.mark.timeout(5)
def test_without_gpu_units_the_inherited_mask_is_kept_and_none_is_added() -> None:
    with holding({"licence": 10_000}):
        assert task_environment({"CUDA_VISIBLE_DEVICES": "3"}) == {
            "CUDA_VISIBLE_DEVICES": "3",
            "APPORTION_RESOURCE_LICENCE": "1",
        }
        assert "CUDA_VISIBLE_DEVICES" not in task_environment({})
    with holding({"GPU": 10_000}):  # an amount pool: no identity to name a device by
        assert task_environment({}) == {"APPORTION_RESOURCE_GPU": "1"}


@pytest.mark.timeout(5)
def test_default_base_is_this_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPORTION_TEST_MARKER", "here")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with holding({"gpu": 10_000}, {"gpu": ["1"]}):
        env = task_environment()
    assert env["APPORTION_TEST_MARKER"] == "here" and env["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.timeout(5)
def test_pools_that_share_a_variable_name_are_an_error() -> None:
    with holding({"gpu": 10_000, "GPU": 10_000}, {"gpu": ["0"]}):
        assert task_resources() == {"gpu": [0], "GPU": 1.0}
        with pytest.raises(RuntimeError, match="both map to APPORTION_RESOURCE_GPU"):
            task_environment({})


@pytest.mark.timeout(5)
def test_outside_a_task_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match=r"task_environment\(\) is only available inside"):
        task_environment()
    with holding({}):
        assert task_environment({}) == {} and task_resources() == {}
    with pytest.raises(RuntimeError, match=r"task_resources\(\) is only available inside"):
        task_resources()


_GATES: dict[str, threading.Event] = {}


def _watches_cancel(gate: str) -> bool:
    _GATES[gate].wait(5)
    return task_cancel_event().is_set()


@pytest.mark.timeout(10)
def test_a_cancel_before_a_thread_takes_the_task_still_reaches_it() -> None:
    loop = asyncio.new_event_loop()
    outcomes: list[Any] = []
    runner = TaskRunner(1, {}, outcomes.extend, loop, SimpleNamespace(units={}))
    try:
        blob = dumps_function(_watches_cancel)
        runner.functions.add(function_id(blob), blob)
        first = _GATES["busy"] = threading.Event()
        second = _GATES["queued"] = threading.Event()
        for key in ("busy", "queued"):
            args, _ = pack_call((key,), {})
            runner.submit(Execute(key, function_id(blob), args, (), NOTHING), {})
        # The only thread is busy with "busy": "queued" waits in the queue when cancelled.
        assert runner.cancel(["queued"]) == 1
        first.set()
        second.set()

        async def both() -> None:
            while len(outcomes) < 2:
                await asyncio.sleep(0.01)

        loop.run_until_complete(asyncio.wait_for(both(), 5))
        values = {o.key: o.value for o in outcomes if isinstance(o, Finished)}
        assert values == {"busy": False, "queued": True}
    finally:
        runner.close()
        loop.close()


def _stops_when_asked(gate: str) -> str:
    """Waits for its cancel event; raises ``TaskInterrupted`` if it was an interruption."""
    _GATES[gate].set()
    task_cancel_event().wait(5)
    if task_interrupted():
        raise TaskInterrupted("stopped to run again later")
    return "cancelled"


@pytest.mark.timeout(10)
def test_an_interruption_is_told_from_a_cancel_and_reported_as_one() -> None:
    loop = asyncio.new_event_loop()
    outcomes: list[Any] = []
    runner = TaskRunner(2, {}, outcomes.extend, loop, SimpleNamespace(units={}))
    try:
        blob = dumps_function(_stops_when_asked)
        runner.functions.add(function_id(blob), blob)
        for key in ("interrupted", "cancelled-after"):
            _GATES[key] = threading.Event()
            args, _ = pack_call((key,), {})
            runner.submit(Execute(key, function_id(blob), args, (), NOTHING), {})
            assert _GATES[key].wait(5)
        runner.cancel(["interrupted"], interrupt=True)
        # A cancel wins over an interruption asked before it.
        runner.cancel(["cancelled-after"], interrupt=True)
        runner.cancel(["cancelled-after"])

        async def both() -> None:
            while len(outcomes) < 2:
                await asyncio.sleep(0.01)

        loop.run_until_complete(asyncio.wait_for(both(), 5))
        by_key = {o.key: o for o in outcomes}
        raised = by_key["interrupted"]
        assert isinstance(raised, Raised) and raised.interrupted
        finished = by_key["cancelled-after"]
        assert isinstance(finished, Finished) and finished.value == "cancelled"
    finally:
        runner.close()
        loop.close()


_ASKED = threading.Event()


def _asks_then_watches(gate: str) -> bool:
    event = task_cancel_event()  # made now, by the task's own thread
    _ASKED.set()
    _GATES[gate].wait(5)
    return event.is_set() and task_cancel_event() is event


@pytest.mark.timeout(10)
def test_a_cancel_reaches_a_running_task_that_made_its_event_first() -> None:
    loop = asyncio.new_event_loop()
    outcomes: list[Any] = []
    runner = TaskRunner(1, {}, outcomes.extend, loop, SimpleNamespace(units={}))
    try:
        blob = dumps_function(_asks_then_watches)
        runner.functions.add(function_id(blob), blob)
        gate = _GATES["running"] = threading.Event()
        args, _ = pack_call(("running",), {})
        runner.submit(Execute("running", function_id(blob), args, (), NOTHING), {})
        assert _ASKED.wait(5)
        assert runner.cancel(["running", "unknown"]) == 1
        gate.set()

        async def done() -> None:
            while not outcomes:
                await asyncio.sleep(0.01)

        loop.run_until_complete(asyncio.wait_for(done(), 5))
        assert [(o.key, o.value) for o in outcomes if isinstance(o, Finished)] == [
            ("running", True)
        ]
    finally:
        runner.close()
        loop.close()


class _Big:
    """A stand-in for a large result: it can be watched with a weak reference."""


def _make_big() -> _Big:
    return _Big()


@pytest.mark.timeout(10)
def test_an_idle_thread_holds_neither_the_inputs_nor_the_result_of_its_last_task() -> None:
    loop = asyncio.new_event_loop()
    outcomes: list[Any] = []
    data: dict[str, Any] = {}
    runner = TaskRunner(1, data, outcomes.extend, loop, SimpleNamespace(units={}))
    try:
        blob = dumps_function(_make_big)
        runner.functions.add(function_id(blob), blob)
        args, _ = pack_call((), {})
        given = _Big()
        runner.submit(Execute("out", function_id(blob), args, ("in",), NOTHING), {"in": given})

        async def delivered() -> None:
            while not outcomes:
                await asyncio.sleep(0.01)

        loop.run_until_complete(asyncio.wait_for(delivered(), 5))
        watched = [weakref.ref(given), weakref.ref(data["out"])]
        # What a data store does when it spills or forgets them.
        del given
        outcomes.clear()
        data.clear()
        assert [ref() for ref in watched] == [None, None]
    finally:
        runner.close()
        loop.close()


@pytest.mark.timeout(5)
def test_only_an_actors_call_finds_the_actors_of_its_own_worker() -> None:
    hosted = SimpleNamespace(instance=object())
    actors = SimpleNamespace(local={"other": hosted}.get)
    worker: Any = SimpleNamespace(units={}, address="tcp://w:1", actors=actors)
    assert local_actor("other", "tcp://w:1") is None  # not on a worker
    with running_task(worker, Execute("t", "f", b"", (), NOTHING), threading.Event()):
        assert local_actor("other", "tcp://w:1") is None  # a task, not an actor
    with running_actor(worker, "me", NOTHING):
        assert local_actor("other", "tcp://w:1") == ActorHere(hosted, on_thread=True)
        assert local_actor("other", "tcp://elsewhere:1") is None
        assert local_actor("released", "tcp://w:1") is None
    assert local_actor("other", "tcp://w:1") is None

    async def async_method() -> ActorHere | None:
        return local_actor("other", "tcp://w:1")

    async def on_the_loop() -> list[ActorHere | None]:
        with awaiting_actor(worker, "me", NOTHING):
            inside = await asyncio.create_task(async_method())
        # A coroutine interleaved on the same loop is no actor's call.
        return [inside, await asyncio.create_task(async_method())]

    assert asyncio.run(on_the_loop()) == [ActorHere(hosted, on_thread=False), None]
