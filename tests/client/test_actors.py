"""Actors, as Dask's "Actors" page uses them, the import changed; and resources held
for an actor's lifetime (an in-memory cluster: no socket, no subprocess)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from collections.abc import Iterator

import pytest

from apportion import (
    Actor,
    ActorFuture,
    Client,
    Future,
    as_completed,
    get_worker,
    task_resources,
)
from apportion.testing import InMemoryCluster
from cli_processes import poll
from cluster_checks import checked_client, settle


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(
        workers=[
            {"name": "gpu-a", "nthreads": 2, "resources": "GPU=1"},
            {"name": "plain", "nthreads": 2},
        ],
    ) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


class Counter:
    """Dask's example actor."""

    n = 0

    def __init__(self) -> None:
        self.n = 0

    def increment(self) -> int:
        self.n += 1
        return self.n

    def add(self, x: int) -> int:
        self.n += x
        return self.n

    def fail(self) -> None:
        raise ValueError("counter refused")

    def where(self) -> tuple[str, dict[str, object]]:
        return get_worker().name, task_resources()

    async def later(self, x: int) -> int:
        await asyncio.sleep(0)
        return self.n + x


def test_dask_counter_example(client: Client) -> None:
    future = client.submit(Counter, actor=True)
    counter = future.result()
    assert isinstance(counter, Actor)
    call = counter.increment()
    assert isinstance(call, ActorFuture)
    assert call.result() == 1
    assert counter.n == 1
    assert [counter.increment().result() for _ in range(3)] == [2, 3, 4]
    assert counter.add(10).result() == 14
    assert counter.later(1).result() == 15
    assert "increment" in dir(counter)


def test_calls_from_many_threads_run_one_at_a_time(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result()
    calls: list[ActorFuture] = []
    lock = threading.Lock()

    def many() -> None:
        made = [counter.increment() for _ in range(50)]
        with lock:
            calls.extend(made)

    threads = [threading.Thread(target=many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c.result() for c in calls) == list(range(1, 201))
    assert counter.n == 200


def test_a_method_that_raises_raises_at_the_caller(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result()
    call = counter.fail()
    with pytest.raises(ValueError, match="counter refused"):
        call.result()
    assert isinstance(call.exception(), ValueError)
    assert counter.increment().result() == 1  # the actor carries on


def test_an_actor_holds_its_gpu_until_released(client: Client, cluster: InMemoryCluster) -> None:
    future = client.submit(Counter, actor=True, resources={"GPU": 1})
    counter = future.result()
    assert counter.where().result() == ("gpu-a", {"GPU": 1.0})
    waiting = client.submit(task_resources, resources={"GPU": 1}, pure=False)
    reason = client.why(waiting)
    assert "GPU" in reason, reason
    assert not waiting.done()
    del future, counter
    gc.collect()
    assert waiting.result(timeout=10) == {"GPU": 1.0}


def test_a_handle_keeps_its_actor_after_the_future_is_dropped(
    client: Client, cluster: InMemoryCluster
) -> None:
    counter = client.submit(Counter, actor=True).result()  # the future is gone already
    gc.collect()
    assert counter.increment().result() == 1
    assert len(cluster.scheduler.state.tasks) == 1
    del counter
    gc.collect()
    settle(cluster)
    assert not cluster.scheduler.state.tasks
    # The worker drops the object when the scheduler's word reaches it.
    poll(lambda: not any(len(w.actors) for w in cluster.workers), 10, "the actor to go")


def use_counter(counter: Actor, times: int) -> int:
    for _ in range(times):
        counter.increment().result()
    return int(counter.n)


def test_tasks_call_an_actor_passed_to_them(client: Client) -> None:
    future = client.submit(Counter, actor=True)
    counter = future.result()
    # As its future (the task's input is the handle), and as the handle itself.
    by_future = client.submit(use_counter, future, 5, pure=False)
    by_handle = client.submit(use_counter, counter, 5, pure=False)
    assert sorted([by_future.result(), by_handle.result()])[1] == 10
    assert counter.n == 10


def test_each_submit_builds_an_actor_of_its_own(client: Client) -> None:
    a, b = client.submit(Counter, actor=True), client.submit(Counter, actor=True)
    assert a.key != b.key
    a.result().add(3).result()
    assert b.result().n == 0
    assert [c.n for c in client.gather(client.map(Counter, range(0), actor=True))] == []


def test_futures_are_refused_as_method_arguments(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result()
    with pytest.raises(TypeError, match="futures cannot be passed"):
        counter.add(client.submit(int, 1))


def test_a_call_on_a_released_actor_says_so(client: Client, cluster: InMemoryCluster) -> None:
    counter = client.submit(Counter, actor=True).result()
    key = counter.key
    counter._future.release()  # type: ignore[union-attr]
    settle(cluster)
    with pytest.raises(LookupError, match=f"no actor '{key}'"):
        counter.increment().result(timeout=10)


def test_an_awaited_call(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result()

    async def main() -> int:
        return int(await counter.increment())

    assert asyncio.run(main()) == 1


def test_dask_counter_example_with_an_asynchronous_client(cluster: InMemoryCluster) -> None:
    async def main() -> tuple[int, int, int]:
        async with Client(cluster.scheduler.address, asynchronous=True) as client:
            counter = await client.submit(Counter, actor=True)
            first = await counter.increment()
            second = await counter.add(5)
            return first, second, await counter.n  # attributes are awaited too

    assert asyncio.run(asyncio.wait_for(main(), 30)) == (1, 6, 6)
    settle(cluster)
    assert not cluster.scheduler.state.tasks


# --- as_completed over actor calls (as Dask's test_actor.py iterates them) ----------


def test_as_completed_yields_actor_calls_as_they_return(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result()
    calls = [counter.increment() for _ in range(10)]
    seen = [call.result() for call in as_completed(calls)]
    assert sorted(seen) == list(range(1, 11))
    assert all(call.done() for call in calls)


def test_as_completed_mixes_task_futures_and_actor_calls(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result()
    mixed: list[Future | ActorFuture] = [counter.add(5), client.submit(int, "7"), counter.fail()]
    pairs = list(as_completed(mixed, with_results=True, raise_errors=False))
    by_call = {id(f): outcome for f, outcome in pairs}
    assert by_call[id(mixed[0])] == 5
    assert by_call[id(mixed[1])] == 7
    kind, exc, _ = by_call[id(mixed[2])]
    assert kind is ValueError and "counter refused" in str(exc)
    with pytest.raises(ValueError, match="counter refused"):
        list(as_completed([counter.fail()], with_results=True))
    with pytest.raises(TypeError, match="takes futures and actor calls' ActorFutures, not int"):
        as_completed([3])  # type: ignore[list-item]


def test_as_completed_over_actor_calls_of_an_asynchronous_client(
    cluster: InMemoryCluster,
) -> None:
    async def main() -> list[int]:
        async with Client(cluster.scheduler.address, asynchronous=True) as client:
            counter = await client.submit(Counter, actor=True)
            calls = [counter.increment() for _ in range(5)]
            calls_and_task = [*calls, client.submit(int, "0")]
            got = [await call async for call in as_completed(calls_and_task)]
            with pytest.raises(RuntimeError, match="use 'async for"):
                next(as_completed([counter.increment()]))
            return sorted(got)

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1, 2, 3, 4, 5]
    settle(cluster)


def test_an_actor_call_takes_dask_durations(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result()
    assert counter.increment().result(timeout="10s") == 1
    assert counter.fail().exception(timeout="1 minute") is not None
    blocked = ActorFuture(concurrent.futures.Future(), "Counter.increment", "inproc://x")
    with pytest.raises(TimeoutError, match="did not return"):
        blocked.result(timeout="20ms")
    with pytest.raises(ValueError, match="timeout='soon' is not a duration"):
        blocked.result(timeout="soon")


# --- an actor calling an actor of its own worker (Dask's test_one_thread_deadlock*) --


@pytest.fixture(scope="module")
def one_thread() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(workers=[{"name": "solo", "nthreads": 1}]) as c:
        yield c


class UsesCounter:
    """An actor whose methods take another actor (Dask's test_actor.py)."""

    def do_inc(self, ac: Actor) -> int:
        # Already done: a round trip could not fit in the timeout.
        return int(ac.increment().result(timeout=0.001))

    def call(self, ac: Actor, name: str) -> tuple[bool, bool, object, object]:
        made = getattr(ac, name)()
        assert isinstance(made, ActorFuture)
        return made.done(), type(made.exception()) is ValueError, repr(made), made.exception()

    def where_both(self, ac: Actor) -> tuple[object, dict[str, object]]:
        return ac.where().result(), task_resources()

    def read_n(self, ac: Actor) -> object:
        return ac.n  # the value itself, not a future

    def run_coroutine(self, ac: Actor) -> tuple[bool, int]:
        coroutine = ac.later(10)
        return asyncio.iscoroutine(coroutine), asyncio.run(coroutine)

    def awaited(self, ac: Actor) -> int:
        async def main() -> int:
            return int(await ac.add(2))

        return asyncio.run(main())


def test_an_actor_calls_an_actor_of_its_one_thread_worker_at_once(
    one_thread: InMemoryCluster,
) -> None:
    with checked_client(one_thread) as client:
        counter = client.submit(Counter, actor=True).result()
        user = client.submit(UsesCounter, actor=True).result()
        assert user.do_inc(counter).result(timeout=10) == 1
        assert user.read_n(counter).result(timeout=10) == 1
        assert user.awaited(counter).result(timeout=10) == 3
        assert user.run_coroutine(counter).result(timeout=10) == (True, 13)
        done, raised, text, exc = user.call(counter, "fail").result(timeout=10)
        assert (done, raised, text) == (True, True, "<ActorFuture: Counter.fail, finished>")
        assert "counter refused" in str(exc)
        assert counter.n == 3


def test_a_direct_call_sees_what_the_called_actor_holds(client: Client) -> None:
    counter = client.submit(Counter, actor=True, resources={"GPU": 1}).result()
    user = client.submit(UsesCounter, actor=True, workers=["gpu-a"]).result()
    called, own = user.where_both(counter).result(timeout=10)
    assert called == ("gpu-a", {"GPU": 1.0})
    assert own == {}


def test_a_finished_actor_future_needs_no_loop_and_no_wait() -> None:
    ok = ActorFuture.finished("C.m", "inproc://w", 5)
    refused = ValueError("no")
    failed = ActorFuture.finished("C.m", "inproc://w", exception=refused)
    assert ok.done() and failed.done()
    assert ok.result(timeout=0) == 5
    seen: list[ActorFuture] = []
    ok.add_done_callback(seen.append)
    assert seen == [ok]
    with pytest.raises(ValueError) as raised:
        failed.result(timeout=0)
    assert raised.value is refused and failed.exception() is refused

    async def main() -> int:
        return int(await ok)

    assert asyncio.run(main()) == 5


class Reentrant:
    """Calls itself, and an actor that calls back, through handles."""

    def __init__(self) -> None:
        self.depth = 0

    def down(self, me: Actor, n: int) -> int:
        # Through a round trip, this call would queue behind itself on the actor's thread.
        return 0 if n == 0 else 1 + int(me.down(me, n - 1).result(timeout=0.001))

    def ping(self, other: Actor, me: Actor) -> int:
        return int(other.pong(me).result()) + 1

    def pong(self, me: Actor) -> int:
        return 10

    def bounce(self, other: Actor, me: Actor) -> int:
        return int(other.ping(me, other).result())


def test_an_actor_calls_itself_and_is_called_back_on_one_thread(
    one_thread: InMemoryCluster,
) -> None:
    with checked_client(one_thread) as client:
        a = client.submit(Reentrant, actor=True).result()
        b = client.submit(Reentrant, actor=True).result()
        assert a.down(a, 3).result(timeout=10) == 3
        # a.bounce -> b.ping -> a.pong, all on a's thread: a is entered twice.
        assert a.bounce(b, a).result(timeout=10) == 11


class Gate:
    """Holds its thread in ``block`` until ``release`` (async: on the loop, so it is
    not queued behind ``block``)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.gate = threading.Event()

    def block(self) -> None:
        self.log.append("block")
        self.gate.wait(10)
        self.log.append("unblocked")

    def record(self) -> None:
        self.log.append("record")

    async def release(self) -> None:
        self.gate.set()

    async def seen(self) -> list[str]:
        return list(self.log)


class Caller:
    calling = False

    def __init__(self) -> None:
        self.calling = False

    def call_record(self, gate: Actor) -> None:
        self.calling = True
        gate.record().result()

    async def is_calling(self) -> bool:
        return self.calling

    async def async_record(self, gate: Actor) -> tuple[bool, list[str]]:
        self.calling = True
        call = gate.record()
        assert isinstance(call, ActorFuture)
        await call
        return call.asynchronous, await gate.seen()


def test_a_direct_call_waits_for_the_call_its_actor_is_running(client: Client) -> None:
    # Both on one worker: the direct call comes from another thread than the gate's.
    gate = client.submit(Gate, actor=True, workers=["plain"]).result()
    caller = client.submit(Caller, actor=True, workers=["plain"]).result()
    blocked = gate.block()
    poll(lambda: gate.seen().result() == ["block"], 10, "the gate to block")
    called = caller.call_record(gate)
    poll(lambda: caller.is_calling().result(), 10, "the caller to call")
    assert gate.seen().result() == ["block"]  # one call at a time, as through its thread
    gate.release().result()
    called.result(timeout=10)
    blocked.result(timeout=10)
    assert gate.seen().result() == ["block", "unblocked", "record"]


def test_an_async_method_hands_a_plain_call_to_the_actors_thread(client: Client) -> None:
    gate = client.submit(Gate, actor=True, workers=["plain"]).result()
    caller = client.submit(Caller, actor=True, workers=["plain"]).result()
    blocked = gate.block()
    poll(lambda: gate.seen().result() == ["block"], 10, "the gate to block")
    called = caller.async_record(gate)
    poll(lambda: caller.is_calling().result(), 10, "the caller to call")
    # The worker's loop does not wait on the blocked gate: it takes this call.
    gate.release().result(timeout=10)
    assert called.result(timeout=10) == (True, ["block", "unblocked", "record"])
    blocked.result(timeout=10)


class AsyncUser:
    async def use(self, ac: Actor) -> tuple[int, int, object]:
        added = int(await ac.add(5))
        later = int(await ac.later(1))  # an async method's coroutine, awaited here
        return added, later, ac.n


def test_an_async_method_calls_an_actor_of_its_one_thread_worker(
    one_thread: InMemoryCluster,
) -> None:
    with checked_client(one_thread) as client:
        counter = client.submit(Counter, actor=True).result()
        user = client.submit(AsyncUser, actor=True).result()
        assert user.use(counter).result(timeout=10) == (5, 6, 5)


#: Where two actors of one worker meet, each inside a call of its own (same process).
MEETINGS: dict[str, threading.Barrier] = {}


class Crossing:
    def __init__(self, meeting: str) -> None:
        self.meeting = meeting

    def cross(self, other: Actor) -> str:
        MEETINGS[self.meeting].wait(10)  # both run a call now, each on its own thread
        try:
            return str(other.ping().result(timeout=10))
        except RuntimeError as exc:
            return str(exc)

    def ping(self) -> str:
        return "pong"


def test_two_actors_calling_each_other_at_once_are_told_rather_than_stuck(
    client: Client,
) -> None:
    MEETINGS["cross"] = threading.Barrier(2)
    a = client.submit(Crossing, "cross", actor=True, workers=["plain"]).result()
    b = client.submit(Crossing, "cross", actor=True, workers=["plain"]).result()
    outcomes = [call.result(timeout=20) for call in [a.cross(b), b.cross(a)]]
    # One is refused; its call ends, and so the other's goes in.
    assert outcomes.count("pong") == 1, outcomes
    (refused,) = (o for o in outcomes if o != "pong")
    assert "actors of one worker calling each other at once" in refused, refused
    assert a.ping().result(timeout=10) == b.ping().result(timeout=10) == "pong"


def thread_name() -> str:
    return threading.current_thread().name


class Threads:
    def name(self) -> str:
        return thread_name()

    def names(self, other: Actor) -> tuple[str, str]:
        return thread_name(), str(other.name().result())


def test_only_an_actor_calls_an_actor_of_its_worker_directly(
    one_thread: InMemoryCluster,
) -> None:
    def from_task(other: Actor) -> tuple[str, str]:
        return thread_name(), str(other.name().result(timeout=10))

    with checked_client(one_thread) as client:
        first = client.submit(Threads, actor=True).result()
        second = client.submit(Threads, actor=True).result()
        caller, called = first.names(second).result(timeout=10)
        assert caller == called and caller.startswith(f"apportion-actor-{first.key}"[:30])
        # A task's call goes to the actor's own thread (as Dask: only actors call at once).
        task, called = client.submit(from_task, second, pure=False).result(timeout=10)
        assert task != called and called.startswith(f"apportion-actor-{second.key}"[:30])
